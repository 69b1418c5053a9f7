"""Without the onnx package, bytes and paths still work (onnx is needed only for ModelProto objects)."""

import subprocess
import sys

from conftest import sample

SCRIPT = r"""
import sys
sys.modules["onnx"] = None  # `import onnx` now fails, as when it is not installed
import bnfold
data = open(sys.argv[1], "rb").read()
folded, report = bnfold.fold(data)
assert isinstance(folded, bytes) and len(folded) > 0 and len(report["folds"]) == 3, report
path, report = bnfold.fold(sys.argv[1], output=sys.argv[2])
assert path == sys.argv[2] and len(report["folds"]) == 3
assert open(sys.argv[2], "rb").read() == folded
assert len(bnfold.check(data)) == 3 and bnfold.info(sys.argv[1])["nodes"] > 0
assert "onnx" not in [name for name, module in sys.modules.items() if module is not None]
print("ok")
"""


def test_bytes_and_paths_work_without_onnx(tmp_path):
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(sample("resnet_block.onnx")), str(tmp_path / "out.onnx")],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
