"""Small convolutional networks with the per-channel spread of trained ones, for the quantization SQNR benchmark.

Random weights with uniform BN statistics show nothing: every channel has the same range, before and after a
fold. What folding damages in a trained network is the spread a BN's per-channel scale s/sqrt(var + eps) puts
into the weights. So the networks here are built eagerly: each layer is also evaluated in numpy on a seeded
calibration batch, and each BatchNormalization gets the mean and variance its input really has there (as a
trained network's running statistics are), with
- BN scales (gamma) spanning two orders of magnitude (log-normal, clipped), shifts (beta) around zero;
- a few nearly dead channels (beta between -3.5 and -2.5 gamma: the Relu after them is almost always 0), whose
  next layer then sees an almost constant channel, a tiny variance and so a huge folded scale;
- filters of very different norms (depthwise filters over a decade, other filters over half a decade), which
  the BN normalises away in float but a per-tensor quantizer of the unfolded model sees.
Deterministic for a seed. Uses Debian's python3-onnx (1.12) and python3-numpy.
"""

import numpy as np
from onnx import TensorProto, helper, numpy_helper

IR_VERSION = 8
BN_EPSILON = 1e-5


def conv2d(x, weight, bias, stride, pad, group):
    """NCHW convolution with square kernels and symmetric padding, in float64."""
    batch, channels, height, width = x.shape
    out_channels, group_channels, kernel, _ = weight.shape
    padded = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    out_h = (height + 2 * pad - kernel) // stride + 1
    out_w = (width + 2 * pad - kernel) // stride + 1
    patches = np.empty((batch, channels, kernel, kernel, out_h, out_w))
    for i in range(kernel):
        for j in range(kernel):
            patches[:, :, i, j] = padded[:, :, i:i + stride * out_h:stride, j:j + stride * out_w:stride]
    patches = patches.reshape(batch, group, group_channels, kernel, kernel, out_h, out_w)
    grouped = weight.reshape(group, out_channels // group, group_channels, kernel, kernel)
    y = np.einsum("ngcklhw,gmckl->ngmhw", patches, grouped, optimize=True).reshape(batch, out_channels, out_h, out_w)
    if bias is not None:
        y += bias.reshape(1, -1, 1, 1)
    return y


def hard_swish(x):
    return x * np.clip(x / 6.0 + 0.5, 0.0, 1.0)


class Tensor:
    """A value of the network: its ONNX name and its numpy value on the calibration batch."""

    def __init__(self, name, value):
        self.name = name
        self.value = value

    @property
    def channels(self):
        return self.value.shape[1]


class EagerNet:
    """Builds an ONNX graph and evaluates it on the calibration batch as it goes (float64 numpy)."""

    def __init__(self, seed, opset, calibration_batch, size):
        self.rng = np.random.default_rng(seed)
        self.seed = seed
        self.opset = opset
        self.nodes = []
        self.initializers = []
        self.image_shape = [3, size, size]
        self.input = Tensor("input", self.rng.uniform(-1.0, 1.0, [calibration_batch] + self.image_shape))
        self.counter = 0

    def _name(self, kind):
        self.counter += 1
        return f"{kind}{self.counter}"

    def _const(self, name, array):
        self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(array, dtype=np.float32), name))
        return name

    def _node(self, op, inputs, value, **attributes):
        name = self._name(op.lower())
        self.nodes.append(helper.make_node(op, inputs, [f"{name}_out"], name=name, **attributes))
        return Tensor(f"{name}_out", value)

    def conv(self, x, out_channels, kernel=3, stride=1, group=1, bias=False, filter_spread=0.5):
        """Conv with He-initialized filters whose norms spread over `filter_spread` decades."""
        in_channels = x.channels
        fan_in = in_channels // group * kernel * kernel
        weight = self.rng.standard_normal((out_channels, in_channels // group, kernel, kernel)) * np.sqrt(2.0 / fan_in)
        weight *= 10.0 ** self.rng.uniform(-filter_spread / 2, filter_spread / 2, (out_channels, 1, 1, 1))
        weight = weight.astype(np.float32).astype(np.float64)
        bias_value = self.rng.normal(0.0, 0.1, out_channels).astype(np.float32).astype(np.float64) if bias else None
        name = f"w{self.counter + 1}"
        inputs = [x.name, self._const(f"{name}.weight", weight)]
        if bias:
            inputs.append(self._const(f"{name}.bias", bias_value))
        pad = kernel // 2
        return self._node("Conv", inputs, conv2d(x.value, weight, bias_value, stride, pad, group),
                          kernel_shape=[kernel, kernel], strides=[stride, stride], pads=[pad] * 4, group=group)

    def depthwise(self, x, kernel=3, stride=1):
        return self.conv(x, x.channels, kernel, stride, group=x.channels, filter_spread=1.0)

    def batch_norm(self, x, dead_fraction=0.04, gamma_decades=(-1.7, 0.3), beta_spread=0.5, high_fraction=0.0):
        """Inference-mode BN whose running statistics are those of its input on the calibration batch;
        `high_fraction` of the channels get a high bias (beta 3.5 to 6 gamma: the Relu after them never cuts)."""
        channels = x.channels
        # Trained BN scales cluster (log-normal here) with tails; the extremes are pinned so that every BN
        # spans the full range.
        low, high = gamma_decades
        decades = np.clip(self.rng.normal((low + high) / 2, (high - low) / 5, channels), low, high)
        decades[self.rng.choice(channels, 2, replace=False)] = (low, high)
        gamma = 10.0 ** decades
        # Most channels are active about half the time or more: beta within a few tenths of gamma around 0.
        beta = self.rng.normal(0.0, beta_spread, channels) * gamma
        dead = self.rng.random(channels) < dead_fraction
        beta[dead] = -self.rng.uniform(2.5, 3.5, dead.sum()) * gamma[dead]
        if high_fraction > 0:  # drawn only when asked, so that the other models keep their numbers
            high = ~dead & (self.rng.random(channels) < high_fraction)
            beta[high] = self.rng.uniform(3.5, 6.0, high.sum()) * gamma[high]
        axes = (0, 2, 3) if x.value.ndim == 4 else (0,)
        mean = x.value.mean(axis=axes)
        # Running estimates are not the exact statistics of any one batch.
        var = x.value.var(axis=axes) * self.rng.uniform(0.9, 1.1, channels)
        params = [a.astype(np.float32).astype(np.float64) for a in (gamma, beta, mean, var)]
        shape = (1, channels) + (1,) * (x.value.ndim - 2)
        gamma, beta, mean, var = params
        y = (x.value - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + BN_EPSILON) * gamma.reshape(shape) \
            + beta.reshape(shape)
        name = f"bn{self.counter + 1}"
        inputs = [x.name] + [self._const(f"{name}.{field}", value)
                             for field, value in zip(("scale", "bias", "mean", "var"), params)]
        return self._node("BatchNormalization", inputs, y, epsilon=BN_EPSILON)

    def relu(self, x):
        return self._node("Relu", [x.name], np.maximum(x.value, 0.0))

    def hard_swish(self, x):
        return self._node("HardSwish", [x.name], hard_swish(x.value))

    def leaky_relu(self, x, alpha=0.1):
        return self._node("LeakyRelu", [x.name], np.where(x.value >= 0.0, x.value, alpha * x.value), alpha=alpha)

    def activation(self, x, kind):
        if kind == "leaky":
            return self.leaky_relu(x)
        return self.relu(x) if kind == "relu" else self.hard_swish(x) if kind == "hardswish" else x

    def max_pool(self, x):
        """2x2 MaxPool with stride 2 (even spatial sizes)."""
        n, c, h, w = x.value.shape
        pooled = x.value.reshape(n, c, h // 2, 2, w // 2, 2).max(axis=(3, 5))
        return self._node("MaxPool", [x.name], pooled, kernel_shape=[2, 2], strides=[2, 2])

    def conv_bn(self, x, out_channels, kernel=3, stride=1, act="relu", **bn):
        return self.activation(self.batch_norm(self.conv(x, out_channels, kernel, stride), **bn), act)

    def dw_bn(self, x, stride=1, act="relu", **bn):
        return self.activation(self.batch_norm(self.depthwise(x, 3, stride), **bn), act)

    def add(self, a, b):
        return self._node("Add", [a.name, b.name], a.value + b.value)

    def global_pool_flatten(self, x):
        pooled = self._node("GlobalAveragePool", [x.name], x.value.mean(axis=(2, 3), keepdims=True))
        return self._node("Flatten", [pooled.name], pooled.value.reshape(pooled.value.shape[0], -1), axis=1)

    def gemm(self, x, out_features):
        in_features = x.value.shape[1]
        weight = self.rng.standard_normal((out_features, in_features)) / np.sqrt(in_features)
        weight = weight.astype(np.float32).astype(np.float64)
        bias = self.rng.normal(0.0, 0.1, out_features).astype(np.float32).astype(np.float64)
        name = f"fc{self.counter + 1}"
        return self._node("Gemm", [x.name, self._const(f"{name}.weight", weight), self._const(f"{name}.bias", bias)],
                          x.value @ weight.T + bias, transB=1)

    def detection_outputs(self, x, fields):
        """NCHW prediction map -> [N, H*W*anchors, fields], as SSD exporters write it."""
        transposed = self._node("Transpose", [x.name], x.value.transpose(0, 2, 3, 1), perm=[0, 2, 3, 1])
        shape = f"shape{self.counter + 1}"
        self.initializers.append(numpy_helper.from_array(np.array([0, -1, fields], dtype=np.int64), shape))
        value = transposed.value.reshape(transposed.value.shape[0], -1, fields)
        return self._node("Reshape", [transposed.name, shape], value)

    def concat(self, parts, axis):
        return self._node("Concat", [p.name for p in parts], np.concatenate([p.value for p in parts], axis=axis),
                          axis=axis)

    def model(self, graph_name, outputs, doc):
        """The ModelProto; outputs are (graph output name, tensor) pairs: the producing node's output is renamed."""
        produced = {node.output[0]: node for node in self.nodes}
        infos = []
        for name, tensor in outputs:
            produced[tensor.name].output[0] = name
            for node in self.nodes:
                node.input[:] = [name if i == tensor.name else i for i in node.input]
            shape = ["N"] + list(tensor.value.shape[1:])
            infos.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, shape))
        image = helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N"] + self.image_shape)
        graph = helper.make_graph(self.nodes, graph_name, [image], infos, self.initializers, doc_string=doc)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.opset)],
                                  producer_name="bnfold-sqnr-bench", producer_version="1")
        model.ir_version = IR_VERSION
        helper.set_model_props(model, {"generator": "scripts/bench/quant/nets.py", "seed": str(self.seed)})
        return model


def mobilenet(seed, calibration_batch, size):
    """MobileNetV1-style: stem Conv, depthwise-separable blocks (dw 3x3 + pw 1x1, BN + Relu after each), GAP, FC."""
    net = EagerNet(seed, 13, calibration_batch, size)
    x = net.conv_bn(net.input, 16, 3, 2)
    for channels, stride in ((32, 1), (64, 2), (64, 1), (128, 2), (128, 1), (128, 1), (256, 2)):
        x = net.dw_bn(x, stride)
        x = net.conv_bn(x, channels, 1)
    logits = net.gemm(net.global_pool_flatten(x), 100)
    return net.model("mobilenet_style", [("logits", logits)], "MobileNetV1-style depthwise-separable blocks, Relu")


def mobilenet_high_bias(seed, calibration_batch, size):
    """The MobileNet blocks with high-bias channels in a quarter of each depthwise BN (trained MobileNets have
    such channels, Nagel et al. 2019), whose next layer (the 1x1 pointwise Conv) pads nothing: what high-bias
    absorption is for."""
    net = EagerNet(seed, 13, calibration_batch, size)
    x = net.conv_bn(net.input, 16, 3, 2)
    for channels, stride in ((32, 1), (64, 2), (64, 1), (128, 2), (128, 1), (128, 1), (256, 2)):
        x = net.dw_bn(x, stride, high_fraction=0.25)
        x = net.conv_bn(x, channels, 1)
    logits = net.gemm(net.global_pool_flatten(x), 100)
    return net.model("mobilenet_high_bias", [("logits", logits)], "MobileNetV1-style blocks with high-bias channels")


def resnet(seed, calibration_batch, size):
    """ResNet-style: basic blocks (Conv-BN-Relu-Conv-BN + shortcut, Add, Relu), projection shortcuts on stride."""
    net = EagerNet(seed, 15, calibration_batch, size)
    x = net.conv_bn(net.input, 16, 3, 1)
    for channels, stride in ((16, 1), (16, 1), (32, 2), (32, 1), (64, 2), (64, 1)):
        branch = net.conv_bn(x, channels, 3, stride)
        # The last BN of a residual branch is small (as after zero-init gamma training), so sums do not blow up.
        branch = net.batch_norm(net.conv(branch, channels, 3, 1), gamma_decades=(-2.0, -0.3), dead_fraction=0.0)
        if stride != 1 or x.channels != channels:
            x = net.batch_norm(net.conv(x, channels, 1, stride), dead_fraction=0.0)
        x = net.relu(net.add(x, branch))
    logits = net.gemm(net.global_pool_flatten(x), 100)
    return net.model("resnet_style", [("logits", logits)], "ResNet-style basic blocks with residual Adds")


def ssd(seed, calibration_batch, size, anchors=3, classes=10):
    """SSDLite-style detector: depthwise-separable backbone, a head per feature map (dw Conv-BN-Relu, then 1x1
    box and score Convs with bias and no BN, as detectors export them), boxes and scores concatenated."""
    net = EagerNet(seed, 13, calibration_batch, size)
    x = net.conv_bn(net.input, 16, 3, 2)
    features = []
    for channels, stride in ((32, 1), (32, 2), (64, 1), (64, 2), (96, 1), (96, 2), (128, 1)):
        x = net.dw_bn(x, stride)
        x = net.conv_bn(x, channels, 1)
        if channels in (64, 96, 128) and stride == 1:
            features.append(x)
    boxes, scores = [], []
    for feature in features:
        head = net.dw_bn(feature)
        boxes.append(net.detection_outputs(net.conv(head, anchors * 4, 1, bias=True, filter_spread=0.0), 4))
        scores.append(net.detection_outputs(net.conv(head, anchors * classes, 1, bias=True, filter_spread=0.0),
                                            classes))
    return net.model("ssd_style", [("boxes", net.concat(boxes, 1)), ("scores", net.concat(scores, 1))],
                     "SSDLite-style detector head with Concat")


def plain_relu(seed, calibration_batch, size):
    """VGG-style chain of Conv-BN-Relu (strided Convs instead of pooling), GAP, FC: every link is equalizable."""
    net = EagerNet(seed, 17, calibration_batch, size)
    x = net.input
    for channels, stride in ((16, 1), (32, 2), (32, 1), (64, 2), (64, 1), (64, 1), (128, 2), (128, 1)):
        x = net.conv_bn(x, channels, 3, stride)
    logits = net.gemm(net.global_pool_flatten(x), 100)
    return net.model("plain_relu", [("logits", logits)], "plain chain of Conv-BN-Relu")


def yolo_tiny(seed, calibration_batch, size, anchors=3, classes=10):
    """YOLO-tiny-style backbone: Conv-BN-LeakyRelu blocks, each but the last followed by a 2x2 MaxPool, and a 1x1
    detection Conv with bias on the last map (raw NCHW predictions)."""
    net = EagerNet(seed, 13, calibration_batch, size)
    x = net.input
    for channels in (16, 32, 64, 128):
        x = net.max_pool(net.conv_bn(x, channels, 3, act="leaky"))
    x = net.conv_bn(x, 256, 3, act="leaky")
    head = net.conv(x, anchors * (5 + classes), 1, bias=True, filter_spread=0.0)
    return net.model("yolo_tiny_style", [("predictions", head)], "YOLO-tiny-style Conv-BN-LeakyRelu-MaxPool chain")


def hardswish(seed, calibration_batch, size):
    """MobileNetV3-style: inverted residual blocks (1x1 expand, dw 3x3, 1x1 linear projection, Add when shapes
    match), HardSwish in most blocks and Relu in the first ones, as in the paper."""
    net = EagerNet(seed, 14, calibration_batch, size)
    x = net.conv_bn(net.input, 16, 3, 2, act="hardswish")
    for expanded, channels, stride, act in ((64, 24, 2, "relu"), (72, 24, 1, "relu"), (96, 40, 2, "hardswish"),
                                            (120, 40, 1, "hardswish"), (240, 80, 2, "hardswish"),
                                            (200, 80, 1, "hardswish")):
        y = net.conv_bn(x, expanded, 1, act=act)
        y = net.dw_bn(y, stride, act=act)
        y = net.batch_norm(net.conv(y, channels, 1), gamma_decades=(-1.5, 0.0), dead_fraction=0.0)
        x = net.add(x, y) if stride == 1 and x.channels == channels else y
    x = net.conv_bn(x, 256, 1, act="hardswish")
    logits = net.gemm(net.global_pool_flatten(x), 100)
    return net.model("hardswish_style", [("logits", logits)], "MobileNetV3-style blocks with HardSwish")


# The models whose every activation is Relu and whose layers CLE can all reach (no residual Add, no fan-out).
ALL_RELU = ("mobilenet", "plain-relu")

GENERATORS = {
    "mobilenet": mobilenet,
    "mobilenet-hb": mobilenet_high_bias,
    "resnet": resnet,
    "ssd": ssd,
    "plain-relu": plain_relu,
    "hardswish": hardswish,
    "yolo-tiny": yolo_tiny,
}
