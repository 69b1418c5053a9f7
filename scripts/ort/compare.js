#!/usr/bin/env node
'use strict';
// Numerical oracle for bnfold: runs two ONNX models (or one model and its ONNX test data) in ONNX Runtime with
// graph optimisations disabled and reports per-output differences. See README.md for the modes and exit codes.

const fs = require('fs');
const common = require('./common');
const { OracleError } = common;

const USAGE = `usage:
  compare.js A.onnx B.onnx [--seed N] [--runs K] [--inputs-from DIR] [--atol X] [--rtol Y] [--exact] [--json]
  compare.js --against-testdata MODEL.onnx DATA_DIR [--atol X] [--rtol Y] [--exact] [--json]
  compare.js --batch JOBS.json
  compare.js --serve          (jobs as JSON lines on stdin, one result line each on stdout, until end of input)
exit: 0 ok, 1 outputs differ (or mismatch structurally), 2 error`;

const EXIT_OK = 0, EXIT_DIFFERENT = 1, EXIT_ERROR = 2;

function usageError(message) {
    throw new OracleError(`compare.js: ${message}\n${USAGE}`, 'usage');
}

function parseNumber(flag, text, integer) {
    const value = Number(text);
    if (text === undefined || text === '' || !Number.isFinite(value) || (integer && !Number.isInteger(value))) {
        usageError(`${flag} needs ${integer ? 'an integer' : 'a number'}, got '${text === undefined ? '' : text}'`);
    }
    return value;
}

function parseArgs(argv) {
    const options = { positional: [], seed: 0, runs: 1, json: false, exact: false };
    for (let i = 0; i < argv.length; i++) {
        const arg = argv[i];
        const value = () => {
            if (i + 1 >= argv.length) usageError(`${arg} needs a value`);
            return argv[++i];
        };
        switch (arg) {
            case '--seed': options.seed = parseNumber(arg, value(), true); break;
            case '--runs': options.runs = parseNumber(arg, value(), true); break;
            case '--atol': options.atol = parseNumber(arg, value(), false); break;
            case '--rtol': options.rtol = parseNumber(arg, value(), false); break;
            case '--exact': options.exact = true; break;
            case '--json': options.json = true; break;
            case '--inputs-from': options.inputsFrom = value(); break;
            case '--against-testdata': options.against = true; break;
            case '--batch': options.batch = value(); break;
            case '--serve': options.serve = true; break;
            case '-h': case '--help': process.stdout.write(USAGE + '\n'); process.exit(EXIT_OK); break;
            default:
                if (arg.startsWith('--')) usageError(`unknown option ${arg}`);
                options.positional.push(arg);
        }
    }
    if (options.runs < 1) usageError('--runs must be at least 1');
    return options;
}

/** null = report only; {exact} = bitwise; {atol, rtol} with a missing one taken as 0. */
function toleranceFrom(spec) {
    if (spec.exact) return { exact: true };
    if (spec.atol === undefined && spec.rtol === undefined) return null;
    const atol = spec.atol === undefined ? 0 : Number(spec.atol);
    const rtol = spec.rtol === undefined ? 0 : Number(spec.rtol);
    if (!Number.isFinite(atol) || !Number.isFinite(rtol) || atol < 0 || rtol < 0) {
        throw new OracleError(`tolerances must be non-negative numbers, got atol=${spec.atol} rtol=${spec.rtol}`, 'usage');
    }
    return { atol, rtol };
}

function errorResult(error) {
    if (!(error instanceof OracleError)) error = new OracleError(common.firstLine(error && error.stack || error));
    return { ok: false, outputs: [], error: error.message, error_kind: error.kind };
}

function pickFeeds(feeds, session, modelPath) {
    const picked = {};
    for (const name of session.inputNames) {
        if (!(name in feeds)) {
            throw new OracleError(`${modelPath}: input '${name}' is not an input of the first model`, 'mismatch');
        }
        picked[name] = feeds[name];
    }
    return picked;
}

/** Runs A and B on identical inputs and compares B's outputs with A's, by name. */
async function compareModels(job) {
    const tolerance = toleranceFrom(job);
    let sessionA = null, sessionB = null;
    try {
        sessionA = await common.createSession(job.a);
        sessionB = await common.createSession(job.b);
        common.requireTensorOutputs(sessionA, job.a);
        common.requireTensorOutputs(sessionB, job.b);
        const feedSets = [];
        if (job.inputs_from) {
            for (const dir of common.resolveDataSets(job.inputs_from)) {
                feedSets.push(common.feedsFromDataSet(sessionA, dir));
            }
        } else {
            const seed = job.seed === undefined ? 0 : Number(job.seed);
            const runs = job.runs === undefined ? 1 : Number(job.runs);
            for (let r = 0; r < runs; r++) feedSets.push(common.randomFeeds(sessionA, seed + r, job.a));
        }
        const perRun = [];
        for (const feeds of feedSets) {
            const outputsA = await common.runSession(sessionA, feeds, job.a);
            const outputsB = await common.runSession(sessionB, pickFeeds(feeds, sessionB, job.b), job.b);
            perRun.push(common.compareOutputs(sessionA.outputNames, outputsA, outputsB, tolerance));
        }
        const outputs = common.mergeResults(perRun);
        const result = { ok: outputs.every(o => o.ok), outputs, tolerance };
        const extra = sessionB.outputNames.filter(n => !sessionA.outputNames.includes(n));
        if (extra.length > 0) result.extra_outputs_b = extra;
        return result;
    } catch (e) {
        return errorResult(e);
    } finally {
        common.releaseSession(sessionA);
        common.releaseSession(sessionB);
    }
}

/** Expected outputs of one data set: K-th output_K.pb is the K-th model output unless all files name outputs. */
function expectedOutputs(session, dataDir) {
    const files = common.listNumbered(dataDir, 'output');
    const names = session.outputNames;
    if (files.length !== names.length) {
        throw new OracleError(`${dataDir}: ${files.length} output files but the model has ${names.length} outputs`,
            'mismatch');
    }
    const tensors = files.map(f => common.readTensorFile(f, 'output'));
    const byName = tensors.every(t => names.includes(t.name)) && new Set(tensors.map(t => t.name)).size === names.length;
    const expected = {};
    tensors.forEach((t, k) => { expected[byName ? t.name : names[k]] = t; });
    return expected;
}

/** Runs MODEL on each data set's inputs and compares with its expected outputs. */
async function compareWithTestData(job) {
    const tolerance = toleranceFrom(job);
    let session = null;
    try {
        const dataSets = common.resolveDataSets(job.testdata);
        session = await common.createSession(job.model);
        common.requireTensorOutputs(session, job.model);
        const datasets = [];
        for (const dir of dataSets) {
            const expected = expectedOutputs(session, dir);
            const actual = await common.runSession(session, common.feedsFromDataSet(session, dir), job.model);
            const outputs = common.compareOutputs(session.outputNames, expected, actual, tolerance);
            datasets.push({ dir, ok: outputs.every(o => o.ok), outputs });
        }
        const outputs = common.mergeResults(datasets.map(d => d.outputs));
        return { ok: datasets.every(d => d.ok), outputs, datasets, tolerance };
    } catch (e) {
        return errorResult(e);
    } finally {
        common.releaseSession(session);
    }
}

function exitCodeOf(result) {
    if (result.error) return EXIT_ERROR;
    return result.ok ? EXIT_OK : EXIT_DIFFERENT;
}

function formatNumber(x) {
    if (x === null || x === undefined) return '-';
    if (x === 0) return '0';
    return x.toExponential(3);
}

function printTable(title, result) {
    const lines = [title];
    if (result.error) {
        lines.push(`error: ${result.error}`);
        process.stdout.write(lines.join('\n') + '\n');
        return;
    }
    const rows = [['output', 'shape', 'dtype', 'max_abs', 'max_rel', 'status']];
    for (const o of result.outputs) {
        const dtype = o.dtype_b && o.dtype_b !== o.dtype ? `${o.dtype}/${o.dtype_b}` : (o.dtype || '-');
        rows.push([o.name, `[${o.shape}]`, dtype, formatNumber(o.max_abs), formatNumber(o.max_rel),
            o.ok ? 'ok' : `FAIL: ${o.reason}`]);
    }
    const widths = rows[0].map((_, c) => Math.max(...rows.map(r => r[c].length)));
    for (const r of rows) lines.push(r.map((cell, c) => (c === r.length - 1 ? cell : cell.padEnd(widths[c]))).join('  '));
    if (result.extra_outputs_b) lines.push(`note: outputs only in the second model: ${result.extra_outputs_b.join(', ')}`);
    const t = result.tolerance;
    const verdict = t ? (t.exact ? 'bitwise' : `atol=${t.atol} rtol=${t.rtol}`) : 'no tolerance given';
    lines.push(`${result.ok ? 'OK' : 'DIFFERENT'} (${verdict})`);
    process.stdout.write(lines.join('\n') + '\n');
}

function emit(options, title, result) {
    if (options.json) process.stdout.write(JSON.stringify(result) + '\n');
    else printTable(title, result);
    if (result.error) process.stderr.write(`compare.js: ${result.error}\n`);
}

/** Runs one job object of --batch or --serve; never throws. */
async function runJob(job, where) {
    try {
        if (job && typeof job.model === 'string' && typeof job.testdata === 'string') return await compareWithTestData(job);
        if (job && typeof job.a === 'string' && typeof job.b === 'string') return await compareModels(job);
        throw new OracleError(`${where} needs "a" and "b", or "model" and "testdata"`, 'usage');
    } catch (e) {
        return errorResult(e);
    }
}

/** One JSON line per job; a failing job does not stop the others. */
async function runBatch(file) {
    let jobs;
    try {
        jobs = JSON.parse(fs.readFileSync(file, 'utf8'));
    } catch (e) {
        throw new OracleError(`${file}: cannot read batch file: ${e.message.replace(/\s+/g, ' ')}`, 'usage');
    }
    if (!Array.isArray(jobs)) throw new OracleError(`${file}: batch file must hold a JSON array of jobs`, 'usage');
    let exitCode = EXIT_OK;
    for (let index = 0; index < jobs.length; index++) {
        const result = await runJob(jobs[index], `${file}: job ${index}`);
        process.stdout.write(JSON.stringify({ job: index, ...result }) + '\n');
        if (result.error) process.stderr.write(`compare.js: job ${index}: ${result.error}\n`);
        exitCode = Math.max(exitCode, exitCodeOf(result));
    }
    return exitCode;
}

/**
 * A long-lived oracle (test/support's compareInOrt keeps one per test process, so ORT loads once, not once per
 * comparison): each stdin line is a batch job, answered by one result line, in order. Ends at end of input.
 */
async function serve() {
    const lines = require('readline').createInterface({ input: process.stdin, crlfDelay: Infinity });
    for await (const line of lines) {
        if (line.trim() === '') continue;
        let job;
        try {
            job = JSON.parse(line);
        } catch (e) {
            job = null;
        }
        const result = job === null ? errorResult(new OracleError('--serve: a request is not a JSON line', 'usage'))
            : await runJob(job, '--serve: a request');
        process.stdout.write(JSON.stringify(result) + '\n');
    }
    return EXIT_OK;
}

async function main() {
    const options = parseArgs(process.argv.slice(2));
    common.loadOrt(); // fail early, with the install hint, before doing anything else
    if (options.serve) {
        if (options.positional.length > 0 || options.batch !== undefined) usageError('--serve takes no other input');
        return serve();
    }
    if (options.batch !== undefined) {
        if (options.positional.length > 0) usageError('--batch takes no model arguments');
        return runBatch(options.batch);
    }
    if (options.positional.length !== 2) usageError('expected two paths');
    const [first, second] = options.positional;
    const spec = { atol: options.atol, rtol: options.rtol, exact: options.exact };
    let result, title;
    if (options.against) {
        result = await compareWithTestData({ model: first, testdata: second, ...spec });
        title = `compare: ${first} vs test data ${second}`;
    } else {
        result = await compareModels({ a: first, b: second, seed: options.seed, runs: options.runs,
            inputs_from: options.inputsFrom, ...spec });
        const source = options.inputsFrom ? `inputs from ${options.inputsFrom}`
            : `random inputs, seed ${options.seed}, ${options.runs} run(s)`;
        title = `compare: ${first} vs ${second} (${source})`;
    }
    emit(options, title, result);
    return exitCodeOf(result);
}

if (require.main === module) {
    main().then(code => { process.exitCode = code; }, error => {
        const message = error instanceof OracleError ? error.message : `compare.js: ${common.firstLine(error.stack)}`;
        process.stderr.write(message.startsWith('compare.js') ? `${message}\n` : `compare.js: ${message}\n`);
        process.exitCode = EXIT_ERROR;
    });
}

module.exports = { compareModels, compareWithTestData };
