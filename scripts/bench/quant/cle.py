"""Weight fake-quantization and two reference cross-layer equalizations (CLE) on ONNX models, in numpy.

The references the benchmark judges `bnfold fold --equalize` against (the last section of ONNX_NOTES.md in
../shared/ beside the repository: Nagel et al. 2019 as AIMET implements it):
- `equalize_aimet`: one pass over pairs and depthwise triples with AIMET's scale formulas;
- `equalize_sweep`: pairwise scaling s = sqrt(r1/r2) on every link, swept until the scales converge.
Both only equalize a link between two layers with constant float weights (Conv, Gemm) joined directly or through
Relu / PRelu / LeakyRelu (positively homogeneous: g(s*z) = s*g(z) for s > 0), where the intermediate values have
one reader and are not graph outputs, and no weight or bias is shared. So the float function is unchanged; the
benchmark checks that in ONNX Runtime.
"""

import numpy as np
from onnx import numpy_helper

LAYER_OPS = ("Conv", "ConvTranspose", "Gemm", "MatMul")
HOMOGENEOUS_ACTIVATIONS = ("Relu", "PRelu", "LeakyRelu")
INT8_MAX = 127


def _attribute(node, name, default):
    for attribute in node.attribute:
        if attribute.name == name:
            return attribute.i
    return default


class Layer:
    """A layer with a constant weight, seen as a matrix of output channels x input channels (x kernel)."""

    def __init__(self, node, weight, bias_name):
        self.node = node
        self.op = node.op_type
        self.weight_name = node.input[1]
        self.weight = weight
        self.bias_name = bias_name
        self.group = _attribute(node, "group", 1) if self.op in ("Conv", "ConvTranspose") else 1
        self.trans_b = _attribute(node, "transB", 0) if self.op == "Gemm" else 0

    def _as_out_in(self, weight):
        """View [out, in/group, kernel...] of a Conv weight, [out, in] of a Gemm or 2-D MatMul weight."""
        if self.op == "Conv":
            return weight
        if self.op == "Gemm":
            return weight if self.trans_b else weight.T
        if self.op == "MatMul":
            return weight.T
        raise ValueError(f"no channel view for {self.op}")

    def output_channel_ranges(self):
        """max |W| per output channel (what per-channel quantization and CLE's r1 use)."""
        if self.op == "ConvTranspose":
            in_per_group = self.weight.shape[0] // self.group
            blocks = np.abs(self.weight).reshape(self.group, in_per_group, self.weight.shape[1], -1)
            return blocks.max(axis=(1, 3)).reshape(-1)
        view = np.abs(self._as_out_in(self.weight))
        return view.reshape(view.shape[0], -1).max(axis=1)

    @property
    def in_channels(self):
        return self._as_out_in(self.weight).shape[1] * self.group

    @property
    def out_channels(self):
        return self._as_out_in(self.weight).shape[0]

    def is_depthwise(self):
        return self.op == "Conv" and self.group > 1 and self.group == self.in_channels == self.out_channels

    def input_channel_ranges(self):
        """max |W| per input channel (CLE's r2); a grouped Conv's input channel i lives in group i // (C/group)."""
        view = np.abs(self._as_out_in(self.weight))
        out_per_group = view.shape[0] // self.group
        in_per_group = view.shape[1]
        ranges = np.empty(self.in_channels)
        for channel in range(self.in_channels):
            g = channel // in_per_group
            ranges[channel] = view[g * out_per_group:(g + 1) * out_per_group, channel % in_per_group].max()
        return ranges

    def scale_outputs(self, factors, initializers):
        """Output channel i divided by factors[i], bias too."""
        view = self._as_out_in(self.weight)
        view /= factors.reshape((-1,) + (1,) * (view.ndim - 1))
        if self.bias_name:
            initializers[self.bias_name] /= factors

    def scale_inputs(self, factors):
        """Input channel i multiplied by factors[i]."""
        view = self._as_out_in(self.weight)
        out_per_group = view.shape[0] // self.group
        in_per_group = view.shape[1]
        for channel in range(self.in_channels):
            g = channel // in_per_group
            view[g * out_per_group:(g + 1) * out_per_group, channel % in_per_group] *= factors[channel]


class WeightGraph:
    """The constant-weight layers of a model and the equalizable links between them."""

    def __init__(self, model):
        self.model = model
        graph = model.graph
        self.initializers = {t.name: numpy_helper.to_array(t).astype(np.float64) for t in graph.initializer
                             if t.data_type == 1}
        self.readers = {}
        for node in graph.node:
            for slot, name in enumerate(node.input):
                if name:
                    self.readers.setdefault(name, []).append((node, slot))
        self.graph_outputs = {o.name for o in graph.output}
        self.layers = []
        for node in graph.node:
            # A MatMul weight of another rank than 2 has no single output-channel axis: left unquantized.
            if node.op_type in LAYER_OPS and len(node.input) > 1 and node.input[1] in self.initializers \
                    and (node.op_type != "MatMul" or self.initializers[node.input[1]].ndim == 2):
                bias = node.input[2] if len(node.input) > 2 and node.input[2] else None
                self.layers.append(Layer(node, self.initializers[node.input[1]], bias))
        self.layer_of_node = {id(layer.node): layer for layer in self.layers}

    def _only_reader(self, value):
        readers = self.readers.get(value, [])
        if len(readers) != 1 or value in self.graph_outputs:
            return None
        return readers[0]

    def _equalizable(self, layer):
        if layer.op not in ("Conv", "Gemm") or len(self.readers.get(layer.weight_name, [])) != 1:
            return False
        if layer.bias_name and (layer.bias_name not in self.initializers
                                or len(self.readers.get(layer.bias_name, [])) != 1
                                or self.initializers[layer.bias_name].shape != (layer.out_channels,)):
            return False
        return layer.op != "Gemm" or _attribute(layer.node, "transA", 0) == 0

    def link_after(self, layer):
        """The layer equalizable with `layer` as its second half, or None."""
        if not self._equalizable(layer):
            return None
        reader = self._only_reader(layer.node.output[0])
        if reader and reader[0].op_type in HOMOGENEOUS_ACTIVATIONS and reader[1] == 0:
            reader = self._only_reader(reader[0].output[0])
        if not reader or reader[1] != 0 or id(reader[0]) not in self.layer_of_node:
            return None
        following = self.layer_of_node[id(reader[0])]
        if not self._equalizable(following) or following.op != layer.op \
                or following.in_channels != layer.out_channels:
            return None
        return following

    def chains(self):
        """Maximal paths of linked layers (each layer has at most one link out and one in)."""
        successor = {id(layer): self.link_after(layer) for layer in self.layers}
        has_predecessor = {id(s) for s in successor.values() if s is not None}
        chains = []
        for layer in self.layers:
            if id(layer) in has_predecessor or successor[id(layer)] is None:
                continue
            chain = [layer]
            while successor[id(chain[-1])] is not None:
                chain.append(successor[id(chain[-1])])
            chains.append(chain)
        return chains

    def updated_model(self):
        model = type(self.model)()
        model.CopyFrom(self.model)
        for tensor in model.graph.initializer:
            if tensor.name in self.initializers and tensor.data_type == 1:
                tensor.CopyFrom(numpy_helper.from_array(self.initializers[tensor.name].astype(np.float32),
                                                        tensor.name))
        return model


def _pair_scales(r1, r2):
    with np.errstate(divide="ignore", invalid="ignore"):
        scales = np.sqrt(r1 / r2)
    scales[(r1 == 0) | (r2 == 0)] = 1.0
    return scales


def _equalize_pair(first, second, initializers):
    scales = _pair_scales(first.output_channel_ranges(), second.input_channel_ranges())
    first.scale_outputs(scales, initializers)
    second.scale_inputs(scales)
    return scales


def _equalize_triple(first, depthwise, last, initializers):
    r1 = first.output_channel_ranges()
    r2 = depthwise.output_channel_ranges()
    r3 = last.input_channel_ranges()
    with np.errstate(divide="ignore", invalid="ignore"):
        geometric = np.cbrt(r1 * r2 * r3)
        s12 = r1 / geometric
        s23 = geometric / r3
    degenerate = (r1 == 0) | (r2 == 0) | (r3 == 0)
    s12[degenerate] = 1.0
    s23[degenerate] = 1.0
    first.scale_outputs(s12, initializers)
    depthwise.scale_inputs(s12)
    depthwise.scale_outputs(s23, initializers)
    last.scale_inputs(s23)


def _aimet_sets(chain):
    """AIMET's split of a chain into CLS sets: Conv+Conv and depthwise+Conv pairs, Conv+depthwise+Conv triples.
    Other layers (Gemm, grouped but not depthwise) and a Conv+depthwise with no Conv after it are left out."""
    kinds = ["conv" if layer.op == "Conv" and layer.group == 1 else "depthwise" if layer.is_depthwise() else None
             for layer in chain]
    sets = []
    i = 0
    while i + 1 < len(chain):
        if kinds[i] == "conv" and kinds[i + 1] == "depthwise" and i + 2 < len(chain) and kinds[i + 2] == "conv":
            sets.append(chain[i:i + 3])
            i += 2
            continue
        if kinds[i] in ("conv", "depthwise") and kinds[i + 1] == "conv":
            sets.append(chain[i:i + 2])
        i += 1
    return sets


def equalize_aimet(model):
    """AIMET's method: each chain split into pairs and depthwise triples, each set scaled once, in order.
    Returns (model, summary)."""
    graph = WeightGraph(model)
    pairs = triples = 0
    for chain in graph.chains():
        for layers in _aimet_sets(chain):
            if len(layers) == 3:
                _equalize_triple(*layers, graph.initializers)
                triples += 1
            else:
                _equalize_pair(*layers, graph.initializers)
                pairs += 1
    return graph.updated_model(), {"pairs": pairs, "triples": triples}


def equalize_sweep(model, tolerance=1e-4, max_sweeps=1000):
    """Pairwise CLE on every link, swept until no scale moves by more than `tolerance` (relative)."""
    graph = WeightGraph(model)
    links = [(chain[i], chain[i + 1]) for chain in graph.chains() for i in range(len(chain) - 1)]
    sweeps = 0
    while links and sweeps < max_sweeps:
        sweeps += 1
        largest_change = max(float(np.abs(np.log(_equalize_pair(a, b, graph.initializers))).max()) for a, b in links)
        if largest_change < tolerance:
            break
    return graph.updated_model(), {"links": len(links), "sweeps": sweeps, "converged": sweeps < max_sweeps}


def _fake_quantize(values, axis_ranges=None):
    """Symmetric int8: round(w / scale) clipped to [-127, 127], times scale; scale = range / 127."""
    ranges = np.abs(values).max() if axis_ranges is None else axis_ranges
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = np.where(ranges > 0, ranges / INT8_MAX, 1.0)
    return np.clip(np.round(values / scale), -INT8_MAX, INT8_MAX) * scale


def _per_channel_fake_quantize(layer):
    weight = layer.weight.copy()
    if layer.op == "ConvTranspose":
        in_per_group = weight.shape[0] // layer.group
        blocks = weight.reshape(layer.group, in_per_group, weight.shape[1], -1)
        ranges = np.abs(blocks).max(axis=(1, 3), keepdims=True)
        return _fake_quantize(blocks, ranges).reshape(weight.shape)
    view = layer._as_out_in(weight)
    ranges = np.abs(view).reshape(view.shape[0], -1).max(axis=1).reshape((-1,) + (1,) * (view.ndim - 1))
    view[...] = _fake_quantize(view, ranges)
    return weight


def quantize_weights(model, per_channel=False):
    """Every constant float weight of a Conv/ConvTranspose/Gemm/MatMul fake-quantized to int8 (biases and
    everything else stay float). Returns (model, number of weights quantized)."""
    graph = WeightGraph(model)
    done = set()
    for layer in graph.layers:
        if layer.weight_name in done:
            continue
        done.add(layer.weight_name)
        quantized = _per_channel_fake_quantize(layer) if per_channel else _fake_quantize(layer.weight)
        graph.initializers[layer.weight_name][...] = quantized
    return graph.updated_model(), len(done)



def worst_range_spread(model):
    """Largest ratio, over the layers, of a layer's largest output-channel weight range to its median one: how
    much of the int8 grid per-tensor quantization gives away in the worst layer."""
    worst = 1.0
    for layer in WeightGraph(model).layers:
        ranges = layer.output_channel_ranges()
        median = float(np.median(ranges))
        if median > 0:
            worst = max(worst, float(ranges.max()) / median)
    return worst
