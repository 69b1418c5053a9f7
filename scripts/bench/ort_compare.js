#!/usr/bin/env node
'use strict';
// The benchmark's reference for `bnfold fold --verify` (issue 15): ONNX Runtime comparing the original and the
// folded model, exactly as scripts/ort/compare.js does it (its compareModels: two sessions without graph
// optimisation, one intra-op thread, one run each on the same seeded random inputs, outputs compared), timed
// inside the process so that node's start-up and the module's `require` can be left out.
//
// usage: ort_compare.js ORIGINAL.onnx FOLDED.onnx [--atol X] [--rtol Y]
// stdout: one JSON line {"require_s", "compare_s", "total_s", "ok", "max_abs", "max_rel", "error"}: seconds to
// load the modules, to compare (two session creations, two runs, the comparison, the releases), and both.
// Exit 0 outputs match, 1 they differ, 2 error (one line on stderr).

const startNs = process.hrtime.bigint();
const seconds = (from, to) => Number(to - from) / 1e9;

function fail(message) {
    process.stderr.write(`ort_compare: ${message}\n`);
    process.exit(2);
}

function parseArgs(argv) {
    const options = { positional: [], atol: 1e-5, rtol: 1e-4 };
    for (let i = 0; i < argv.length; i++) {
        const arg = argv[i];
        const value = () => (i + 1 < argv.length ? Number(argv[++i]) : fail(`${arg} needs a value`));
        if (arg === '--atol') options.atol = value();
        else if (arg === '--rtol') options.rtol = value();
        else if (arg.startsWith('--')) fail(`unknown option ${arg}`);
        else options.positional.push(arg);
    }
    if (options.positional.length !== 2) fail('usage: ort_compare.js ORIGINAL.onnx FOLDED.onnx [--atol X] [--rtol Y]');
    if (!(options.atol >= 0) || !(options.rtol >= 0)) fail('--atol and --rtol must be non-negative numbers');
    return options;
}

async function main() {
    const options = parseArgs(process.argv.slice(2));
    let compareModels;
    try {
        require('../ort/common').loadOrt();
        ({ compareModels } = require('../ort/compare'));
    } catch (e) {
        fail(e.message);
    }
    const loadedNs = process.hrtime.bigint();
    const [a, b] = options.positional;
    const result = await compareModels({ a, b, seed: 0, runs: 1, atol: options.atol, rtol: options.rtol });
    const doneNs = process.hrtime.bigint();
    const worst = (key) => (result.outputs.length ? Math.max(...result.outputs.map(o => o[key] || 0)) : null);
    process.stdout.write(JSON.stringify({
        require_s: seconds(startNs, loadedNs),
        compare_s: seconds(loadedNs, doneNs),
        total_s: seconds(startNs, doneNs),
        ok: result.ok,
        max_abs: worst('max_abs'),
        max_rel: worst('max_rel'),
        error: result.error || null,
    }) + '\n');
    if (result.error) fail(result.error);
    process.exitCode = result.ok ? 0 : 1;
}

main().catch((e) => fail(String(e && e.stack || e).split('\n')[0]));
