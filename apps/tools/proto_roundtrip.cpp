// The benchmark's floor: parse a ModelProto from a file and serialize it straight back to another file.
// Nothing else; bnfold's own cost is measured against this.

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl.h>
#include <onnx/onnx_pb.h>

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s IN.onnx OUT.onnx\n", argv[0]);
    return 2;
  }
  onnx::ModelProto model;
  const int in = open(argv[1], O_RDONLY);
  if (in < 0) {
    std::perror(argv[1]);
    return 2;
  }
  {
    google::protobuf::io::FileInputStream stream(in, 1 << 20);
    if (!model.ParseFromZeroCopyStream(&stream)) {
      std::fprintf(stderr, "%s: cannot parse\n", argv[1]);
      return 2;
    }
  }
  close(in);
  const int out = open(argv[2], O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (out < 0) {
    std::perror(argv[2]);
    return 2;
  }
  {
    google::protobuf::io::FileOutputStream stream(out, 1 << 20);
    if (!model.SerializeToZeroCopyStream(&stream) || !stream.Flush()) {
      std::fprintf(stderr, "%s: cannot write\n", argv[2]);
      return 2;
    }
  }
  return close(out) == 0 ? 0 : 2;
}
