#!/usr/bin/env node
'use strict';
// ONNX Runtime's own offline optimisation, the benchmark's reference: create an onnxruntime-node session with
// graph optimisation level `basic` (constant folding, Conv+BN / MatMul+BN fusion, ...) and
// `optimizedModelFilePath`, which makes ORT write the optimised graph while the session is created.
//
// usage: ort_optimize.js IN.onnx OUT.onnx [--level basic|extended|all] [--external-data NAME]
//   --external-data NAME: write initializers to NAME beside OUT (needed when the result exceeds 2 GiB).
// stdout: one JSON line {"require_s", "create_s", "total_s"}: seconds to load the module, to create the
// session (load + optimise + write + session setup), and both. Exit 0 ok, 2 error (one line on stderr).

const path = require('path');

const startNs = process.hrtime.bigint();
const seconds = (from, to) => Number(to - from) / 1e9;

function fail(message) {
    process.stderr.write(`ort_optimize: ${message}\n`);
    process.exit(2);
}

function parseArgs(argv) {
    const options = { positional: [], level: 'basic', externalData: null };
    for (let i = 0; i < argv.length; i++) {
        const arg = argv[i];
        const value = () => (i + 1 < argv.length ? argv[++i] : fail(`${arg} needs a value`));
        if (arg === '--level') options.level = value();
        else if (arg === '--external-data') options.externalData = value();
        else if (arg.startsWith('--')) fail(`unknown option ${arg}`);
        else options.positional.push(arg);
    }
    if (options.positional.length !== 2) fail('usage: ort_optimize.js IN.onnx OUT.onnx [--level basic] [--external-data NAME]');
    if (!['basic', 'extended', 'all'].includes(options.level)) fail(`--level must be basic, extended or all, got '${options.level}'`);
    return options;
}

async function main() {
    const options = parseArgs(process.argv.slice(2));
    const [input, output] = options.positional;
    let ort;
    try {
        ort = require(path.join(__dirname, '..', 'ort', 'common.js')).loadOrt();
    } catch (e) {
        fail(e.message);
    }
    const loadedNs = process.hrtime.bigint();
    const sessionOptions = {
        graphOptimizationLevel: options.level,
        optimizedModelFilePath: output,
        // One thread: bnfold is single-threaded, and the machine's cores are shared.
        executionMode: 'sequential',
        intraOpNumThreads: 1,
        interOpNumThreads: 1,
        logSeverityLevel: 3,
    };
    if (options.externalData) {
        sessionOptions.extra = {
            session: {
                optimized_model_external_initializers_file_name: options.externalData,
                optimized_model_external_initializers_min_size_in_bytes: '1024',
            },
        };
    }
    let session;
    try {
        session = await ort.InferenceSession.create(input, sessionOptions);
    } catch (e) {
        fail(`${input}: ONNX Runtime cannot optimise the model: ${String(e && e.message || e).split('\n')[0]}`);
    }
    const createdNs = process.hrtime.bigint();
    await session.release();
    process.stdout.write(JSON.stringify({
        require_s: seconds(startNs, loadedNs),
        create_s: seconds(loadedNs, createdNs),
        total_s: seconds(startNs, createdNs),
    }) + '\n');
}

main().catch((e) => fail(String(e && e.stack || e).split('\n')[0]));
