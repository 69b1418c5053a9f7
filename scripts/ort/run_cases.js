#!/usr/bin/env node
'use strict';
// Runs every .onnx model of a folder in ONNX Runtime (graph optimisation disabled, one thread) and writes its
// outputs as JSON next to it: MODEL.onnx -> MODEL.json. The models take no inputs: every operand is an
// initializer, so a whole table of generated op cases runs in one node start-up (test_reference_kernels.cpp).
//
// MODEL.json: {"ok": true, "outputs": [{"name", "type", "dims": [...], "data": [...]}]}
//          or {"ok": false, "error": "one line", "kind": "ort-load" | "ort-run" | ...}
// Numbers are written exactly (float32 widens to double without loss); NaN and infinities as the strings "NaN",
// "Infinity", "-Infinity"; int64 as numbers when they are safe integers, as decimal strings otherwise.
// Exit: 0 when every model ran or was reported in its JSON, 2 on a usage or I/O error.

const fs = require('fs');
const path = require('path');
const common = require('./common');
const { OracleError } = common;

const USAGE = 'usage: run_cases.js FOLDER';

function jsonValue(v) {
    if (typeof v === 'bigint') return Number.isSafeInteger(Number(v)) ? Number(v) : v.toString();
    if (typeof v === 'number' && !Number.isFinite(v)) return Number.isNaN(v) ? 'NaN' : (v > 0 ? 'Infinity' : '-Infinity');
    return v;
}

async function runOne(modelPath) {
    let session = null;
    try {
        session = await common.createSession(modelPath);
        common.requireTensorOutputs(session, modelPath);
        const results = await common.runSession(session, {}, modelPath);
        const outputs = session.outputNames.map(name => {
            const t = results[name];
            return { name, type: t.type, dims: t.dims.map(Number), data: Array.from(t.data, jsonValue) };
        });
        return { ok: true, outputs };
    } catch (e) {
        const error = e instanceof OracleError ? e : new OracleError(common.firstLine(e && e.stack || e));
        return { ok: false, error: error.message, detail: error.detail, kind: error.kind };
    } finally {
        common.releaseSession(session);
    }
}

async function main(argv) {
    if (argv.length !== 1 || argv[0].startsWith('-')) {
        process.stderr.write(USAGE + '\n');
        return 2;
    }
    const folder = argv[0];
    common.loadOrt();
    const models = fs.readdirSync(folder).filter(f => f.endsWith('.onnx')).sort();
    let failed = 0;
    for (const file of models) {
        const modelPath = path.join(folder, file);
        const result = await runOne(modelPath);
        if (!result.ok) failed++;
        fs.writeFileSync(modelPath.replace(/\.onnx$/, '.json'), JSON.stringify(result));
    }
    process.stdout.write(`${models.length} model(s), ${failed} not run\n`);
    return 0;
}

main(process.argv.slice(2)).then(code => process.exit(code), e => {
    process.stderr.write(`run_cases.js: ${common.firstLine(e && e.message || e)}\n`);
    process.exit(2);
});
