'use strict';
// Shared code of compare.js and conformance.js: locating onnxruntime-node, reading ONNX TensorProto files,
// seeded random inputs, running a model, and comparing two sets of outputs.

const fs = require('fs');
const os = require('os');
const path = require('path');

const ORT_VERSION = '1.30.0';

/** Error whose message is already a complete one-line diagnostic; `kind` classifies it for callers. */
class OracleError extends Error {
    /** detail: the cause alone (e.g. ORT's own message), for callers that word the context themselves. */
    constructor(message, kind = 'error', detail = undefined) {
        super(message);
        this.kind = kind;
        this.detail = detail === undefined ? message : detail;
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Locating onnxruntime-node (same default path as ensure_ort.sh)

function defaultOrtNodeModules() {
    const home = process.env.HOME || os.homedir();
    const cacheBase = process.env.BNFOLD_CACHE_DIR ||
        path.join(process.env.XDG_CACHE_HOME || path.join(home, '.cache'), 'bnfold');
    return path.join(cacheBase, `ort-node-${ORT_VERSION}`, 'node_modules');
}

let ortModule = null;

/** Loads onnxruntime-node once; throws an OracleError with a one-line hint when it is not installed. */
function loadOrt() {
    if (ortModule) return ortModule;
    const nodeModules = process.env.BNFOLD_ORT_NODE_MODULES || defaultOrtNodeModules();
    const modulePath = path.join(nodeModules, 'onnxruntime-node');
    if (!fs.existsSync(modulePath)) {
        throw new OracleError(`onnxruntime-node not installed in ${nodeModules}: run scripts/ort/ensure_ort.sh ` +
            'and set BNFOLD_ORT_NODE_MODULES to the path it prints');
    }
    try {
        ortModule = require(modulePath);
    } catch (e) {
        throw new OracleError(`cannot load ${modulePath}: ${firstLine(e.message)}`);
    }
    // ORT logs load failures itself before throwing them; we report them, so keep its own log quiet.
    ortModule.env.logLevel = 'fatal';
    return ortModule;
}

/** Session options: no graph optimisation (ORT must not fold anything itself) and one thread, so that runs are
 *  repeatable bit for bit and we do not compete for the shared cores. */
function sessionOptions(threads = 1) {
    return {
        graphOptimizationLevel: 'disabled',
        executionMode: 'sequential',
        intraOpNumThreads: threads,
        interOpNumThreads: 1,
        logSeverityLevel: 4,
    };
}

async function createSession(modelPath, threads = 1) {
    const ort = loadOrt();
    if (!fs.existsSync(modelPath)) throw new OracleError(`${modelPath}: no such file`, 'io');
    try {
        return await ort.InferenceSession.create(modelPath, sessionOptions(threads));
    } catch (e) {
        const why = ortMessage(e);
        throw new OracleError(`${modelPath}: ONNX Runtime cannot load the model: ${why}`, 'ort-load', why);
    }
}

async function runSession(session, feeds, modelPath) {
    try {
        return await session.run(feeds);
    } catch (e) {
        const why = ortMessage(e);
        throw new OracleError(`${modelPath}: ONNX Runtime cannot run the model: ${why}`, 'ort-run', why);
    }
}

function releaseSession(session) {
    if (session) session.release().catch(() => {});
}

function firstLine(text) {
    return String(text).split('\n').map(s => s.trim()).find(s => s.length > 0) || '(no message)';
}

// ORT messages repeat "Load model from X failed:" and carry source locations; keep the part that says why.
function ortMessage(error) {
    let text = firstLine(error && error.message !== undefined ? error.message : error);
    text = text.replace(/^Load model from \S+ failed:/, '');
    text = text.replace(/\/onnxruntime_src\/\S+:\d+ /g, '');
    return text.trim();
}

// ---------------------------------------------------------------------------------------------------------------
// Element types

// ONNX TensorProto.DataType code -> ORT type name and how the typed fields store it.
const ONNX_TYPES = {
    1: { ort: 'float32', bytes: 4 },
    2: { ort: 'uint8', bytes: 1 },
    3: { ort: 'int8', bytes: 1 },
    4: { ort: 'uint16', bytes: 2 },
    5: { ort: 'int16', bytes: 2 },
    6: { ort: 'int32', bytes: 4 },
    7: { ort: 'int64', bytes: 8 },
    8: { ort: 'string', bytes: 0 },
    9: { ort: 'bool', bytes: 1 },
    10: { ort: 'float16', bytes: 2 },
    11: { ort: 'float64', bytes: 8 },
    12: { ort: 'uint32', bytes: 4 },
    13: { ort: 'uint64', bytes: 8 },
};
const ONNX_TYPE_NAMES = {
    14: 'complex64', 15: 'complex128', 16: 'bfloat16', 17: 'float8e4m3fn', 18: 'float8e4m3fnuz',
    19: 'float8e5m2', 20: 'float8e5m2fnuz', 21: 'uint4', 22: 'int4',
};

const TYPED_ARRAYS = {
    float32: Float32Array, float64: Float64Array, float16: Uint16Array,
    int8: Int8Array, int16: Int16Array, int32: Int32Array, int64: BigInt64Array,
    uint8: Uint8Array, uint16: Uint16Array, uint32: Uint32Array, uint64: BigUint64Array, bool: Uint8Array,
};

const FLOAT_TYPES = new Set(['float32', 'float64', 'float16']);

// ---------------------------------------------------------------------------------------------------------------
// float16 <-> float32

const f32Scratch = new Float32Array(1);
const u32Scratch = new Uint32Array(f32Scratch.buffer);

function halfBitsToFloat(bits) {
    const sign = bits & 0x8000 ? -1 : 1;
    const exponent = (bits >> 10) & 0x1f;
    const mantissa = bits & 0x3ff;
    if (exponent === 0) return sign * mantissa * 2 ** -24; // zero and subnormals
    if (exponent === 0x1f) return mantissa ? NaN : sign * Infinity;
    return sign * (1 + mantissa / 1024) * 2 ** (exponent - 15);
}

/** float32 -> float16 bits, rounding to nearest even (used only to make random float16 inputs). */
function floatToHalfBits(value) {
    f32Scratch[0] = value;
    const x = u32Scratch[0];
    const sign = (x >>> 16) & 0x8000;
    const exponent = (x >>> 23) & 0xff;
    let mantissa = x & 0x7fffff;
    if (exponent === 0xff) return sign | 0x7c00 | (mantissa ? 0x200 : 0);
    let e = exponent - 127 + 15;
    if (e >= 0x1f) return sign | 0x7c00;
    if (e <= 0) {
        if (e < -10) return sign;
        mantissa |= 0x800000;
        const shift = 14 - e;
        let half = mantissa >>> shift;
        const rest = mantissa & ((1 << shift) - 1);
        const midpoint = 1 << (shift - 1);
        if (rest > midpoint || (rest === midpoint && (half & 1))) half += 1;
        return sign | half;
    }
    let half = (e << 10) | (mantissa >>> 13);
    const rest = mantissa & 0x1fff;
    if (rest > 0x1000 || (rest === 0x1000 && (half & 1))) half += 1; // may carry into the exponent: still right
    return sign | half;
}

// ---------------------------------------------------------------------------------------------------------------
// Protobuf wire format and TensorProto

class WireReader {
    constructor(bytes, file) {
        this.bytes = bytes;
        this.pos = 0;
        this.file = file;
    }
    done() { return this.pos >= this.bytes.length; }
    fail(what) { throw new OracleError(`${this.file}: malformed protobuf (${what} at byte ${this.pos})`, 'format'); }

    varintBig() {
        let result = 0n;
        let shift = 0n;
        for (;;) {
            if (this.pos >= this.bytes.length) this.fail('truncated varint');
            const byte = this.bytes[this.pos++];
            result |= BigInt(byte & 0x7f) << shift;
            if (!(byte & 0x80)) return result;
            shift += 7n;
            if (shift > 63n) this.fail('varint longer than 10 bytes');
        }
    }
    /** Varint known to be small (tags, lengths, dims, enums): plain arithmetic, exact up to 2^53. */
    varint() {
        let result = 0;
        let scale = 1;
        for (let i = 0; i < 10; i++) {
            if (this.pos >= this.bytes.length) this.fail('truncated varint');
            const byte = this.bytes[this.pos++];
            result += (byte & 0x7f) * scale;
            if (!(byte & 0x80)) return result;
            scale *= 128;
        }
        this.fail('varint longer than 10 bytes');
    }
    lengthDelimited() {
        const length = this.varint();
        if (this.pos + length > this.bytes.length) this.fail('length past end of data');
        const slice = this.bytes.subarray(this.pos, this.pos + length);
        this.pos += length;
        return slice;
    }
    fixed(size) {
        if (this.pos + size > this.bytes.length) this.fail('truncated fixed-size field');
        const slice = this.bytes.subarray(this.pos, this.pos + size);
        this.pos += size;
        return slice;
    }
    skip(wireType) {
        switch (wireType) {
            case 0: this.varintBig(); break;
            case 1: this.fixed(8); break;
            case 2: this.lengthDelimited(); break;
            case 5: this.fixed(4); break;
            default: this.fail(`unsupported wire type ${wireType}`);
        }
    }
}

// A repeated scalar field arrives packed (one length-delimited run) or one element per tag.
function readRepeatedVarints(reader, wireType, out, asBig) {
    if (wireType === 2) {
        const sub = new WireReader(reader.lengthDelimited(), reader.file);
        while (!sub.done()) out.push(asBig ? sub.varintBig() : sub.varint());
    } else if (wireType === 0) {
        out.push(asBig ? reader.varintBig() : reader.varint());
    } else {
        reader.fail(`wire type ${wireType} for a varint field`);
    }
}

function readRepeatedFixed(reader, wireType, size, out) {
    const expected = size === 4 ? 5 : 1;
    if (wireType === 2) {
        out.push(reader.lengthDelimited());
    } else if (wireType === expected) {
        out.push(reader.fixed(size));
    } else {
        reader.fail(`wire type ${wireType} for a fixed${size * 8} field`);
    }
}

function concatBytes(chunks) {
    const total = chunks.reduce((n, c) => n + c.length, 0);
    const out = new Uint8Array(total); // fresh buffer: aligned for any typed array view
    let offset = 0;
    for (const c of chunks) { out.set(c, offset); offset += c.length; }
    return out;
}

/**
 * Decodes an ONNX TensorProto file into {name, dims, type (ORT name), data (typed array as ORT wants it)}.
 * Throws OracleError kind 'unsupported' for valid-looking non-tensor files (SequenceProto, OptionalProto) and for
 * element types ORT's JavaScript API cannot hold. `role` ('input', 'output') only words the messages.
 */
function decodeTensorProto(bytes, file, role = 'value') {
    const reader = new WireReader(bytes, file);
    const dims = [];
    let dataType = null;
    let name = '';
    let raw = null;
    const floatChunks = [], doubleChunks = [];
    const int32Values = [], int64Values = [], uint64Values = [], strings = [];
    let externalData = false;
    let sawForeignField = false;
    while (!reader.done()) {
        const tag = reader.varint();
        const field = Math.floor(tag / 8);
        const wireType = tag & 7;
        switch (field) {
            case 1: readRepeatedVarints(reader, wireType, dims, false); break;
            case 2:
                if (wireType !== 0) reader.fail('data_type is not a varint');
                dataType = reader.varint();
                break;
            case 4: readRepeatedFixed(reader, wireType, 4, floatChunks); break;
            case 5: readRepeatedVarints(reader, wireType, int32Values, true); break;
            case 6:
                if (wireType !== 2) reader.fail('string_data is not length-delimited');
                strings.push(Buffer.from(reader.lengthDelimited()).toString('utf8'));
                break;
            case 7: readRepeatedVarints(reader, wireType, int64Values, true); break;
            case 8:
                if (wireType !== 2) reader.fail('name is not length-delimited');
                name = Buffer.from(reader.lengthDelimited()).toString('utf8');
                break;
            case 9:
                if (wireType !== 2) reader.fail('raw_data is not length-delimited');
                raw = reader.lengthDelimited();
                break;
            case 10: readRepeatedFixed(reader, wireType, 8, doubleChunks); break;
            case 11: readRepeatedVarints(reader, wireType, uint64Values, true); break;
            case 12: reader.skip(wireType); break; // doc_string
            case 13: reader.skip(wireType); externalData = true; break;
            case 14:
                if (wireType !== 0) reader.fail('data_location is not a varint');
                if (reader.varint() === 1) externalData = true;
                break;
            default:
                // Field 3 (segment) is never written for test data, but it is where SequenceProto and OptionalProto
                // keep their tensors.
                sawForeignField = true;
                reader.skip(wireType);
        }
    }
    // data_type 0 (UNDEFINED) is what an empty OptionalProto's elem_type looks like through TensorProto's eyes.
    if (sawForeignField || !dataType) {
        throw new OracleError(`${file}: unsupported ${role} kind: not a TensorProto ` +
            '(SequenceProto/OptionalProto/MapProto?)', 'unsupported');
    }
    if (externalData) throw new OracleError(`${file}: tensor with external data is not supported`, 'unsupported');
    const info = ONNX_TYPES[dataType];
    if (!info) {
        const known = ONNX_TYPE_NAMES[dataType];
        throw new OracleError(`${file}: element type ${known || dataType} is not supported`,
            known ? 'unsupported' : 'format');
    }
    const count = dims.reduce((n, d) => n * d, 1);
    const type = info.ort;
    let data;
    if (type === 'string') {
        data = strings;
    } else if (raw !== null) {
        if (raw.length !== count * info.bytes) {
            throw new OracleError(`${file}: raw_data holds ${raw.length} bytes, dims [${dims}] of ${type} need ` +
                `${count * info.bytes}`, 'format');
        }
        const copy = concatBytes([raw]);
        data = new TYPED_ARRAYS[type](copy.buffer, 0, count); // little-endian host assumed (x86-64, arm64)
    } else {
        const Ctor = TYPED_ARRAYS[type];
        if (type === 'float32') {
            const bytesAll = concatBytes(floatChunks);
            data = new Float32Array(bytesAll.buffer, 0, bytesAll.length / 4);
        } else if (type === 'float64') {
            const bytesAll = concatBytes(doubleChunks);
            data = new Float64Array(bytesAll.buffer, 0, bytesAll.length / 8);
        } else if (type === 'int64') {
            data = BigInt64Array.from(int64Values, v => BigInt.asIntN(64, v));
        } else if (type === 'uint64' || type === 'uint32') {
            data = type === 'uint64' ? BigUint64Array.from(uint64Values, v => BigInt.asUintN(64, v))
                : Uint32Array.from(uint64Values, v => Number(BigInt.asUintN(32, v)));
        } else {
            // int32_data carries int32 and every narrower type (float16 as its bit pattern).
            const signed = type === 'int8' || type === 'int16' || type === 'int32';
            data = Ctor.from(int32Values, v => Number(signed ? BigInt.asIntN(32, v) : BigInt.asUintN(32, v)));
        }
    }
    if (data.length !== count) {
        throw new OracleError(`${file}: ${data.length} elements stored, dims [${dims}] need ${count}`, 'format');
    }
    return { name, dims, type, data };
}

function readTensorFile(file, role = 'value') {
    let bytes;
    try {
        bytes = fs.readFileSync(file);
    } catch (e) {
        throw new OracleError(`${file}: cannot read: ${e.code || e.message}`, 'io');
    }
    return decodeTensorProto(new Uint8Array(bytes.buffer, bytes.byteOffset, bytes.length), file, role);
}

/** Files named PREFIX_<K>.pb in a test_data_set folder, ordered by K. */
function listNumbered(dir, prefix) {
    const pattern = new RegExp(`^${prefix}_(\\d+)\\.pb$`);
    return fs.readdirSync(dir)
        .map(f => [f, pattern.exec(f)])
        .filter(([, m]) => m)
        .sort((x, y) => Number(x[1][1]) - Number(y[1][1]))
        .map(([f]) => path.join(dir, f));
}

/** test_data_set_* folders under a model folder, in numeric order. */
function listDataSets(modelDir) {
    if (!fs.existsSync(modelDir)) return [];
    return fs.readdirSync(modelDir)
        .map(f => [f, /^test_data_set_(\d+)$/.exec(f)])
        .filter(([f, m]) => m && fs.statSync(path.join(modelDir, f)).isDirectory())
        .sort((x, y) => Number(x[1][1]) - Number(y[1][1]))
        .map(([f]) => path.join(modelDir, f));
}

/** A test-data path may be one test_data_set folder or a model folder holding several. */
function resolveDataSets(dataPath) {
    if (!fs.existsSync(dataPath) || !fs.statSync(dataPath).isDirectory()) {
        throw new OracleError(`${dataPath}: not a directory`, 'io');
    }
    if (listNumbered(dataPath, 'input').length > 0 || listNumbered(dataPath, 'output').length > 0) return [dataPath];
    const sets = listDataSets(dataPath);
    if (sets.length === 0) throw new OracleError(`${dataPath}: no input_K.pb files and no test_data_set_* folders`, 'io');
    return sets;
}

function toOrtTensor(tensor) {
    const ort = loadOrt();
    return new ort.Tensor(tensor.type, tensor.data, tensor.dims);
}

/**
 * Feeds built from a test_data_set folder's input_K.pb. Matched by name when every file names a model input,
 * otherwise the K-th file goes to the K-th model input (names in backend test data are often empty).
 */
function feedsFromDataSet(session, dataDir) {
    requireTensorInputs(session, dataDir);
    const files = listNumbered(dataDir, 'input');
    const tensors = files.map(f => readTensorFile(f, 'input'));
    const inputNames = session.inputNames;
    if (tensors.length > inputNames.length) {
        throw new OracleError(`${dataDir}: ${tensors.length} input files but the model has ${inputNames.length} inputs`,
            'mismatch');
    }
    const byName = tensors.length > 0 && tensors.every(t => inputNames.includes(t.name));
    const feeds = {};
    tensors.forEach((t, k) => { feeds[byName ? t.name : inputNames[k]] = toOrtTensor(t); });
    const missing = inputNames.filter(n => !(n in feeds));
    if (missing.length > 0) {
        throw new OracleError(`${dataDir}: no data for model input(s) ${missing.join(', ')}`, 'mismatch');
    }
    return feeds;
}

// ---------------------------------------------------------------------------------------------------------------
// Seeded random inputs

/** mulberry32: tiny deterministic 32-bit PRNG; returns floats in [0, 1). */
function mulberry32(seed) {
    let state = seed >>> 0;
    return () => {
        state = (state + 0x6d2b79f5) >>> 0;
        let t = state;
        t = Math.imul(t ^ (t >>> 15), t | 1);
        t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
        return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
    };
}

// Unknown or symbolic dimensions become 1.
function concreteShape(shape) {
    return (shape || []).map(d => (typeof d === 'number' && Number.isInteger(d) && d >= 0 ? d : 1));
}

/**
 * Random feeds for every input in the session's metadata: floats uniform in [-1, 1); integers 0..4 (small, so
 * they are valid indices/axes/counts for most ops); bool 0/1.
 */
function randomFeeds(session, seed, modelPath) {
    const ort = loadOrt();
    const random = mulberry32(seed);
    const feeds = {};
    for (const meta of session.inputMetadata) {
        if (!meta.isTensor) {
            throw new OracleError(`${modelPath}: unsupported input kind: input '${meta.name}' is not a tensor ` +
                '(sequence/optional/map), cannot make random data for it', 'unsupported');
        }
        const shape = concreteShape(meta.shape);
        const count = shape.reduce((n, d) => n * d, 1);
        let data;
        switch (meta.type) {
            case 'float32': data = Float32Array.from({ length: count }, () => random() * 2 - 1); break;
            case 'float64': data = Float64Array.from({ length: count }, () => random() * 2 - 1); break;
            case 'float16': data = Uint16Array.from({ length: count }, () => floatToHalfBits(random() * 2 - 1)); break;
            case 'int64': data = BigInt64Array.from({ length: count }, () => BigInt(Math.floor(random() * 5))); break;
            case 'uint64': data = BigUint64Array.from({ length: count }, () => BigInt(Math.floor(random() * 5))); break;
            case 'bool': data = Uint8Array.from({ length: count }, () => (random() < 0.5 ? 0 : 1)); break;
            case 'int32': case 'int16': case 'int8': case 'uint32': case 'uint16': case 'uint8':
                data = TYPED_ARRAYS[meta.type].from({ length: count }, () => Math.floor(random() * 5));
                break;
            default:
                throw new OracleError(`${modelPath}: input '${meta.name}' has element type ${meta.type}, ` +
                    'which random inputs do not support', 'unsupported');
        }
        feeds[meta.name] = new ort.Tensor(meta.type, data, shape);
    }
    return feeds;
}

// ---------------------------------------------------------------------------------------------------------------
// Comparing outputs

const REL_FLOOR = 1e-30; // max_rel divides by max(|a|, REL_FLOOR)

/** Plain-number view of a tensor's elements (float16 bit patterns decoded); strings stay strings. */
function numericView(tensor) {
    const data = tensor.data;
    if (tensor.type === 'float16' && data instanceof Uint16Array) return Float64Array.from(data, halfBitsToFloat);
    return data;
}

function sameShape(a, b) {
    return a.length === b.length && a.every((d, i) => d === Number(b[i]));
}

/**
 * Compares reference tensor `a` with `b` element by element.
 * tolerance: null (report only), {exact: true} (bitwise but NaN == NaN), or {atol, rtol}
 * (|a - b| <= atol + rtol * |a|, NaN only where a has NaN, infinities equal).
 */
function compareTensors(name, a, b, tolerance) {
    const result = {
        name,
        shape: a.dims.map(Number),
        shape_b: b.dims.map(Number),
        dtype: a.type,
        dtype_b: b.type,
        max_abs: 0,
        max_rel: 0,
        nan_mismatch: 0,
        nan_in_both: 0, // elements compared only as "both NaN": many of them make a weak comparison
        inf_mismatch: 0,
        out_of_tolerance: 0,
        ok: true,
    };
    const problems = [];
    if (!sameShape(result.shape, result.shape_b)) problems.push(`shape [${result.shape}] vs [${result.shape_b}]`);
    if (a.type !== b.type) problems.push(`dtype ${a.type} vs ${b.type}`);
    if (problems.length === 0) {
        const va = numericView(a), vb = numericView(b);
        const bigints = typeof va[0] === 'bigint';
        for (let i = 0; i < va.length; i++) {
            const x = va[i], y = vb[i];
            if (a.type === 'string') {
                if (x !== y) { result.out_of_tolerance++; }
                continue;
            }
            if (bigints) {
                if (x !== y) {
                    const diff = Math.abs(Number(x - y));
                    result.max_abs = Math.max(result.max_abs, diff);
                    result.max_rel = Math.max(result.max_rel, diff / Math.max(Math.abs(Number(x)), REL_FLOOR));
                    if (tolerance && (tolerance.exact || diff > tolerance.atol + tolerance.rtol * Math.abs(Number(x)))) {
                        result.out_of_tolerance++;
                    }
                }
                continue;
            }
            const xNaN = Number.isNaN(x), yNaN = Number.isNaN(y);
            if (xNaN || yNaN) {
                if (xNaN !== yNaN) result.nan_mismatch++;
                else result.nan_in_both++;
                continue;
            }
            if (!Number.isFinite(x) || !Number.isFinite(y)) {
                if (x !== y) result.inf_mismatch++;
                continue;
            }
            const diff = Math.abs(x - y);
            if (diff > result.max_abs) result.max_abs = diff;
            const rel = diff / Math.max(Math.abs(x), REL_FLOOR);
            if (rel > result.max_rel) result.max_rel = rel;
            if (tolerance) {
                // Object.is tells +0 from -0: bitwise identity is what --rules none promises.
                const bad = tolerance.exact ? !Object.is(x, y) : diff > tolerance.atol + tolerance.rtol * Math.abs(x);
                if (bad) result.out_of_tolerance++;
            }
        }
        if (result.nan_mismatch) problems.push(`${result.nan_mismatch} NaN mismatch(es)`);
        if (result.inf_mismatch) problems.push(`${result.inf_mismatch} Inf mismatch(es)`);
        if (result.out_of_tolerance) {
            problems.push(tolerance && tolerance.exact ? `${result.out_of_tolerance} element(s) not bitwise identical`
                : `${result.out_of_tolerance} element(s) outside tolerance`);
        }
    }
    if (problems.length > 0) {
        result.ok = false;
        result.reason = problems.join('; ');
    }
    return result;
}

/**
 * Compares two output maps by name, in the order of `names` (reference outputs). A name missing from `outputsB`
 * is a failure.
 */
function compareOutputs(names, outputsA, outputsB, tolerance) {
    return names.map(name => {
        if (!(name in outputsB)) {
            return { name, shape: outputsA[name].dims.map(Number), max_abs: null, max_rel: null, ok: false,
                reason: 'output missing in the second model' };
        }
        return compareTensors(name, outputsA[name], outputsB[name], tolerance);
    });
}

/** Merges per-run results of the same outputs (several seeds / data sets) into the worst case. */
function mergeResults(runs) {
    const merged = new Map();
    for (const run of runs) {
        for (const r of run) {
            const m = merged.get(r.name);
            if (!m) { merged.set(r.name, { ...r }); continue; }
            for (const key of ['max_abs', 'max_rel']) {
                if (r[key] === null || m[key] === null) m[key] = null;
                else m[key] = Math.max(m[key], r[key]);
            }
            for (const key of ['nan_mismatch', 'nan_in_both', 'inf_mismatch', 'out_of_tolerance']) {
                if (key in r) m[key] = (m[key] || 0) + r[key];
            }
            if (!r.ok) {
                m.ok = false;
                if (!m.reason) m.reason = r.reason;
            }
        }
    }
    return [...merged.values()];
}

function isNonTensorOutput(session, name) {
    const meta = (session.outputMetadata || []).find(m => m.name === name);
    return meta !== undefined && meta.isTensor === false;
}

function requireTensorInputs(session, where) {
    const nonTensor = (session.inputMetadata || []).filter(m => m.isTensor === false).map(m => m.name);
    if (nonTensor.length > 0) {
        throw new OracleError(`${where}: unsupported input kind: input(s) ${nonTensor.join(', ')} are not ` +
            'tensors (sequence/optional/map)', 'unsupported');
    }
}

/** Throws 'unsupported' when the model has outputs ORT's JavaScript API cannot hand back as tensors. */
function requireTensorOutputs(session, modelPath) {
    const nonTensor = session.outputNames.filter(n => isNonTensorOutput(session, n));
    if (nonTensor.length > 0) {
        throw new OracleError(`${modelPath}: unsupported output kind: output(s) ${nonTensor.join(', ')} are not ` +
            'tensors (sequence/optional/map)', 'unsupported');
    }
}

module.exports = {
    ORT_VERSION,
    OracleError,
    defaultOrtNodeModules,
    loadOrt,
    createSession,
    runSession,
    releaseSession,
    firstLine,
    ortMessage,
    halfBitsToFloat,
    floatToHalfBits,
    decodeTensorProto,
    readTensorFile,
    listNumbered,
    listDataSets,
    resolveDataSets,
    feedsFromDataSet,
    toOrtTensor,
    mulberry32,
    randomFeeds,
    compareTensors,
    compareOutputs,
    mergeResults,
    requireTensorInputs,
    requireTensorOutputs,
    FLOAT_TYPES,
};
