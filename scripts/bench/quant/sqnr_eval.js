#!/usr/bin/env node
'use strict';
// Signal-to-quantization-noise measurements for scripts/bench/quant/sqnr_bench.py, in one node start-up.
//
// usage: sqnr_eval.js JOBS.json
//        sqnr_eval.js --calibrate JOBS.json   ({"seeds", "models": [{"name", "path"}]}: largest |output| per output)
// JOBS.json: {"seeds": [0, 1, ...], "models": [{"name", "reference": PATH, "candidates": {LABEL: PATH, ...}}]}
// Each candidate runs on the same seeded random inputs as its reference (scripts/ort/common.js's randomFeeds:
// floats uniform in [-1, 1)), sessions as in compare.js (no graph optimisation, one thread).
// stdout: one JSON object {"models": [{"name", "candidates": {LABEL: {"outputs": [{"name", "signal", "noise",
// "max_abs", "reference_max_abs"}]}}}]}, sums over all seeds: signal = sum ref^2, noise = sum (ref - out)^2.
// Exit 0 when every model ran, 2 on any error (one line on stderr).

const fs = require('fs');
const common = require('../../ort/common');

function fail(message) {
    process.stderr.write(`sqnr_eval: ${message}\n`);
    process.exit(2);
}

async function outputsFor(path, feedsPerSeed) {
    const session = await common.createSession(path);
    try {
        common.requireTensorOutputs(session, path);
        const results = [];
        for (const feeds of feedsPerSeed) results.push(await common.runSession(session, feeds, path));
        return { names: session.outputNames, results };
    } finally {
        common.releaseSession(session);
    }
}

function floatValues(tensor, path, name) {
    if (!common.FLOAT_TYPES.has(tensor.type)) throw new common.OracleError(`${path}: output '${name}' is not float`);
    return tensor.type === 'float16' ? Float64Array.from(tensor.data, common.halfBitsToFloat) : tensor.data;
}

function accumulate(reference, candidate, path) {
    return reference.names.map(name => {
        const sums = { name, signal: 0, noise: 0, max_abs: 0, reference_max_abs: 0 };
        reference.results.forEach((refOutputs, run) => {
            const candidateOutputs = candidate.results[run];
            if (!(name in candidateOutputs)) throw new common.OracleError(`${path}: output '${name}' missing`);
            const a = floatValues(refOutputs[name], path, name);
            const b = floatValues(candidateOutputs[name], path, name);
            if (a.length !== b.length) throw new common.OracleError(`${path}: output '${name}' has another size`);
            for (let i = 0; i < a.length; i++) {
                const diff = a[i] - b[i];
                sums.signal += a[i] * a[i];
                sums.noise += diff * diff;
                // NaN compares false: make it visible instead of silently skipped.
                const absDiff = Number.isNaN(diff) ? Infinity : Math.abs(diff);
                if (absDiff > sums.max_abs) sums.max_abs = absDiff;
                if (Math.abs(a[i]) > sums.reference_max_abs) sums.reference_max_abs = Math.abs(a[i]);
            }
        });
        return sums;
    });
}

// --calibrate: the largest |value| of each output of each model over the seeded inputs (per-tensor activation
// ranges; the caller exposes the activations as outputs).
async function calibrate(jobs) {
    const report = { models: [] };
    for (const model of jobs.models) {
        const session = await common.createSession(model.path);
        try {
            const maxAbs = {};
            for (const seed of jobs.seeds) {
                const outputs = await common.runSession(session, common.randomFeeds(session, seed, model.path), model.path);
                for (const name of session.outputNames) {
                    const values = floatValues(outputs[name], model.path, name);
                    let largest = maxAbs[name] || 0;
                    for (let i = 0; i < values.length; i++) largest = Math.max(largest, Math.abs(values[i]));
                    maxAbs[name] = largest;
                }
            }
            report.models.push({ name: model.name, max_abs: maxAbs });
        } finally {
            common.releaseSession(session);
        }
    }
    process.stdout.write(JSON.stringify(report) + '\n');
}

async function main() {
    const calibrating = process.argv[2] === '--calibrate';
    if (process.argv.length !== (calibrating ? 4 : 3)) fail('usage: sqnr_eval.js [--calibrate] JOBS.json');
    let jobs;
    try {
        jobs = JSON.parse(fs.readFileSync(process.argv[process.argv.length - 1], 'utf8'));
        common.loadOrt();
    } catch (e) {
        fail(e.message);
    }
    if (calibrating) return calibrate(jobs);
    const report = { models: [] };
    for (const model of jobs.models) {
        const probe = await common.createSession(model.reference);
        const feedsPerSeed = jobs.seeds.map(seed => common.randomFeeds(probe, seed, model.reference));
        common.releaseSession(probe);
        const reference = await outputsFor(model.reference, feedsPerSeed);
        const candidates = {};
        for (const [label, path] of Object.entries(model.candidates)) {
            candidates[label] = { outputs: accumulate(reference, await outputsFor(path, feedsPerSeed), path) };
        }
        report.models.push({ name: model.name, candidates });
    }
    process.stdout.write(JSON.stringify(report) + '\n');
}

main().catch((e) => fail(e instanceof common.OracleError ? e.message : String(e && e.stack || e).split('\n')[0]));
