#!/usr/bin/env node
'use strict';
// Conformance run of bnfold over the ONNX backend test models (Debian's libonnx-testdata): fold every model, check
// the result with the ONNX checker, and compare original and folded outputs in ONNX Runtime on the test data
// inputs. Every model that cannot be compared is listed with the reason. See README.md.
//
// ONNX Runtime runs in a forked worker (this file with --worker) so that a crash or hang inside ORT costs one
// model, not the whole run.

const childProcess = require('child_process');
const fs = require('fs');
const os = require('os');
const path = require('path');
const common = require('./common');
const { OracleError } = common;

const USAGE = `usage: conformance.js --bnfold PATH --checker PATH [--rules RULES] [--out DIR] [--filter SUBSTR]
                      [--atol X] [--rtol Y] [--data DIR] [--suites a,b,...] [--timeout SECONDS] [--sample N] [--verify] [--verbose]
  --verify   runs fold with --verify: every rewrite must also pass bnfold's own numeric check
  --sample N keeps every model whose name says BatchNormalization, Conv, Gemm or MatMul (the ops the rules rewrite)
             and every Nth of the others (default 1: all); the same models in every run
  --rules none (default) requires bitwise-identical outputs; any other value uses --atol/--rtol (default 1e-5)`;

const DEFAULTS = {
    rules: 'none',
    out: path.join(os.tmpdir(), 'bnfold-conformance'),
    filter: '',
    atol: 1e-5,
    rtol: 1e-5,
    data: '/usr/share/libonnx-testdata/data',
    suites: ['node', 'pytorch-converted', 'pytorch-operator', 'simple'],
    timeout: 120,
    sample: 1,
    verify: false,
    verbose: false,
};

// ---------------------------------------------------------------------------------------------------------------
// Worker side: all ONNX Runtime work for one model

function pickFeeds(feeds, session) {
    const picked = {};
    for (const name of session.inputNames) {
        if (!(name in feeds)) throw new OracleError(`the output model needs input '${name}', which the original lacks`);
        picked[name] = feeds[name];
    }
    return picked;
}

/**
 * Runs the original on every data set (any problem there is a skip: the oracle cannot judge), then the output on
 * the same feeds (any problem there is a failure) and compares.
 */
async function compareInOrt(job, reportProgress) {
    let original = null, output = null;
    const skip = reason => ({ status: 'skip', reason });
    const fail = reason => ({ status: 'fail', reason });
    try {
        try {
            original = await common.createSession(job.original);
        } catch (e) {
            return skip(`ORT cannot load the original: ${e.detail}`);
        }
        const feedSets = [];
        try {
            common.requireTensorInputs(original, 'original');
            common.requireTensorOutputs(original, 'original');
            if (job.dataSets.length === 0) feedSets.push(common.randomFeeds(original, 0, 'original'));
            for (const dir of job.dataSets) feedSets.push(common.feedsFromDataSet(original, dir));
        } catch (e) {
            // Drop the "original: " or "<data set folder>: " prefix; the record names the model.
            return skip(e.message.replace(/^(original|\/\S*): /, ''));
        }
        const originalOutputs = [];
        for (const feeds of feedSets) {
            try {
                originalOutputs.push(await common.runSession(original, feeds, job.original));
            } catch (e) {
                return skip(`ORT cannot run the original: ${e.detail}`);
            }
        }
        reportProgress('original-ran');
        try {
            output = await common.createSession(job.output);
        } catch (e) {
            return fail(`ORT cannot load the output: ${e.detail}`);
        }
        const tolerance = job.exact ? { exact: true } : { atol: job.atol, rtol: job.rtol };
        const perRun = [];
        for (let k = 0; k < feedSets.length; k++) {
            let outputs;
            try {
                outputs = await common.runSession(output, pickFeeds(feedSets[k], output), job.output);
            } catch (e) {
                return fail(`ORT cannot run the output: ${e.detail}`);
            }
            perRun.push(common.compareOutputs(original.outputNames, originalOutputs[k], outputs, tolerance));
        }
        const compared = common.mergeResults(perRun);
        const bad = compared.filter(o => !o.ok);
        const summary = compared.map(o => ({ name: o.name, max_abs: o.max_abs, max_rel: o.max_rel, ok: o.ok }));
        if (bad.length > 0) {
            const reason = 'outputs differ: ' + bad.map(o => `${o.name}: ${o.reason}` +
                (typeof o.max_abs === 'number' ? ` (max_abs ${o.max_abs})` : '')).join('; ');
            return { status: 'fail', reason, outputs: summary, dataSets: feedSets.length };
        }
        return { status: 'pass', outputs: summary, dataSets: feedSets.length };
    } catch (e) {
        return fail(`internal error: ${common.firstLine(e && e.stack || e)}`);
    } finally {
        common.releaseSession(original);
        common.releaseSession(output);
    }
}

function runWorker() {
    process.on('message', async job => {
        const result = await compareInOrt(job, stage => process.send({ id: job.id, stage }));
        process.send({ id: job.id, result });
    });
    process.on('disconnect', () => process.exit(0));
}

// ---------------------------------------------------------------------------------------------------------------
// Parent side

/** One long-lived worker; restarted after a crash or a timeout. */
class OrtWorker {
    constructor(timeoutSeconds) {
        this.timeoutMs = timeoutSeconds * 1000;
        this.child = null;
        this.nextId = 0;
    }
    start() {
        this.child = childProcess.fork(__filename, ['--worker'], { stdio: ['ignore', 'inherit', 'inherit', 'ipc'] });
    }
    /** Resolves with the worker's result, or a skip/fail telling how ORT died. */
    run(job) {
        if (!this.child) this.start();
        const child = this.child;
        const id = this.nextId++;
        return new Promise(resolve => {
            let originalRan = false;
            let settled = false;
            const finish = result => {
                if (settled) return;
                settled = true;
                clearTimeout(timer);
                child.removeListener('message', onMessage);
                child.removeListener('exit', onExit);
                resolve(result);
            };
            // A crash while running the original says nothing about bnfold; a crash on the output does.
            const died = what => (originalRan ? { status: 'fail', reason: `ORT ${what} on the output model` }
                : { status: 'skip', reason: `ORT ${what} on the original model` });
            const onMessage = message => {
                if (message.id !== id) return;
                if (message.stage === 'original-ran') originalRan = true;
                if (message.result) finish(message.result);
            };
            const onExit = (code, signal) => {
                this.child = null;
                finish(died(signal ? `crashed (${signal})` : `exited with code ${code}`));
            };
            const timer = setTimeout(() => {
                child.removeListener('exit', onExit);
                child.kill('SIGKILL');
                this.child = null;
                finish(died(`timed out after ${this.timeoutMs / 1000} s`));
            }, this.timeoutMs);
            child.on('message', onMessage);
            child.on('exit', onExit);
            child.send({ ...job, id });
        });
    }
    stop() {
        if (this.child) this.child.disconnect();
    }
}

function usageError(message) {
    throw new OracleError(`conformance.js: ${message}\n${USAGE}`, 'usage');
}

function parseArgs(argv) {
    const options = { ...DEFAULTS };
    const numberArg = (flag, text) => {
        const value = Number(text);
        if (text === undefined || text === '' || !Number.isFinite(value) || value < 0) {
            usageError(`${flag} needs a non-negative number, got '${text === undefined ? '' : text}'`);
        }
        return value;
    };
    for (let i = 0; i < argv.length; i++) {
        const arg = argv[i];
        const value = () => {
            if (i + 1 >= argv.length) usageError(`${arg} needs a value`);
            return argv[++i];
        };
        switch (arg) {
            case '--bnfold': options.bnfold = value(); break;
            case '--checker': options.checker = value(); break;
            case '--rules': options.rules = value(); break;
            case '--out': options.out = value(); break;
            case '--filter': options.filter = value(); break;
            case '--atol': options.atol = numberArg(arg, value()); break;
            case '--rtol': options.rtol = numberArg(arg, value()); break;
            case '--data': options.data = value(); break;
            case '--suites': options.suites = value().split(',').filter(s => s.length > 0); break;
            case '--timeout': options.timeout = numberArg(arg, value()); break;
            case '--sample': options.sample = numberArg(arg, value()); break;
            case '--verbose': options.verbose = true; break;
            case '--verify': options.verify = true; break;
            case '-h': case '--help': process.stdout.write(USAGE + '\n'); process.exit(0); break;
            default: usageError(`unknown argument ${arg}`);
        }
    }
    for (const key of ['bnfold', 'checker']) {
        if (!options[key]) usageError(`--${key} is required`);
        options[key] = path.resolve(options[key]);
        try {
            fs.accessSync(options[key], fs.constants.X_OK);
        } catch (e) {
            throw new OracleError(`conformance.js: ${options[key]}: not an executable file (--${key})`, 'usage');
        }
    }
    if (options.timeout <= 0) usageError('--timeout must be positive');
    if (!Number.isInteger(options.sample) || options.sample < 1) usageError('--sample must be a whole number >= 1');
    options.out = path.resolve(options.out);
    return options;
}

/** Model folders (holding model.onnx) of every suite, sorted, filtered by "suite/name" substring. */
function listModels(options) {
    const models = [];
    for (const suite of options.suites) {
        const suiteDir = path.join(options.data, suite);
        if (!fs.existsSync(suiteDir)) throw new OracleError(`conformance.js: ${suiteDir}: no such test suite folder`);
        for (const name of fs.readdirSync(suiteDir).sort()) {
            const dir = path.join(suiteDir, name);
            const id = `${suite}/${name}`;
            if (!id.includes(options.filter)) continue;
            if (!fs.existsSync(path.join(dir, 'model.onnx'))) continue;
            models.push({ suite, name, id, dir, model: path.join(dir, 'model.onnx') });
        }
    }
    if (options.sample === 1) return models;
    // Sampled (the sanitizer build in CI, where every run costs more): all models of the ops the rules rewrite, and
    // a fixed every-Nth of the rest, so the set does not change between runs.
    const rewritten = /batchnorm|conv|gemm|matmul/i;
    let other = 0;
    return models.filter(m => rewritten.test(m.name) || other++ % options.sample === 0);
}

/** The line of a tool's output that says why: the last line of a Python traceback, else the first line. */
function toolMessage(stderr, stdout) {
    const lines = `${stderr || ''}`.split('\n').map(s => s.trim()).filter(s => s.length > 0);
    if (lines.length > 0) return lines[0].startsWith('Traceback') ? lines[lines.length - 1] : lines[0];
    const out = `${stdout || ''}`.split('\n').map(s => s.trim()).find(s => s.length > 0);
    return out || '(no message)';
}

function describeExit(result) {
    if (result.error) return result.error.code === 'ETIMEDOUT' ? 'timed out' : `could not run (${result.error.code})`;
    return result.signal ? `killed by ${result.signal}` : `exited with ${result.status}`;
}

function runChecker(checker, file, timeoutSeconds) {
    return new Promise(resolve => {
        childProcess.execFile(checker, [file], { timeout: timeoutSeconds * 1000, maxBuffer: 16 << 20 },
            (error, stdout, stderr) => {
                if (!error) return resolve({ ok: true });
                const why = error.killed ? 'timed out' : (error.code !== undefined ? `exit ${error.code}` : 'failed');
                resolve({ ok: false, message: `${toolMessage(stderr, stdout)} (${why})` });
            });
    });
}

/** Folds one model and judges the result. Returns the per-model record. */
async function processModel(entry, options, worker) {
    const record = { model: entry.id, status: 'pass', failures: [], skips: [], checkerSkips: [] };
    const outDir = path.join(options.out, entry.suite);
    const outModel = path.join(outDir, `${entry.name}.onnx`);
    const outReport = path.join(outDir, `${entry.name}.json`);
    fs.mkdirSync(outDir, { recursive: true });
    for (const stale of [outModel, outReport]) fs.rmSync(stale, { force: true });

    // a. fold
    const fold = childProcess.spawnSync(options.bnfold,
        ['fold', entry.model, '-o', outModel, '--report', outReport, '--rules', options.rules, '-q']
            .concat(options.verify ? ['--verify'] : []),
        { encoding: 'utf8', timeout: options.timeout * 1000, maxBuffer: 64 << 20 });
    record.bnfold = { exit: fold.status, signal: fold.signal || undefined, stderr: (fold.stderr || '').trim() };
    if (fold.status !== 0) {
        record.failures.push(`bnfold ${describeExit(fold)}: ${toolMessage(fold.stderr, fold.stdout)}`);
    } else if (!fs.existsSync(outModel)) {
        record.failures.push('bnfold exited 0 but wrote no output model');
    } else if (!fs.existsSync(outReport)) {
        record.failures.push('bnfold exited 0 but wrote no report');
    } else {
        try {
            JSON.parse(fs.readFileSync(outReport, 'utf8'));
        } catch (e) {
            record.failures.push(`the report is not valid JSON: ${common.firstLine(e.message)}`);
        }
    }
    if (record.failures.length > 0 || !fs.existsSync(outModel)) {
        record.status = 'fail';
        return record;
    }

    // b. checker on output and original, running while ORT works (c, d)
    const checks = Promise.all([runChecker(options.checker, outModel, options.timeout),
        runChecker(options.checker, entry.model, options.timeout)]);
    const ort = worker.run({
        original: entry.model,
        output: outModel,
        dataSets: common.listDataSets(entry.dir),
        exact: options.rules === 'none',
        atol: options.atol,
        rtol: options.rtol,
    });
    const [[checkOutput, checkOriginal], ortResult] = await Promise.all([checks, ort]);
    if (!checkOutput.ok) {
        if (checkOriginal.ok) {
            record.failures.push(`checker rejects the output but accepts the original: ${checkOutput.message}`);
        } else {
            record.checkerSkips.push(`checker rejects the original too: ${checkOriginal.message}`);
        }
    }
    record.ort = ortResult;
    if (ortResult.status === 'fail') record.failures.push(ortResult.reason);
    if (ortResult.status === 'skip') record.skips.push(ortResult.reason);
    record.checked = ortResult.status === 'pass' || (ortResult.status === 'fail' && ortResult.outputs !== undefined);
    record.status = record.failures.length > 0 ? 'fail' : (record.skips.length > 0 ? 'skip' : 'pass');
    return record;
}

// Skip reasons name nodes and files; drop those so that one cause makes one group.
function groupKey(reason) {
    return reason
        .replace(/node with name '[^']*'/g, "node with name '...'")
        .replace(/(input|output)\(s\) .* are not tensors/, '$1(s) ... are not tensors')
        .replace(/\/\S+\/(test_data_set_\d+|model\.onnx)\S*/g, '<path>');
}

function groupByReason(records, field) {
    const groups = new Map();
    for (const r of records) {
        for (const reason of r[field]) {
            const key = groupKey(reason);
            if (!groups.has(key)) groups.set(key, []);
            groups.get(key).push(r.model);
        }
    }
    return [...groups.entries()].sort((a, b) => b[1].length - a[1].length || a[0].localeCompare(b[0]));
}

function printGroups(title, groups) {
    if (groups.length === 0) return;
    const lines = [title];
    for (const [reason, models] of groups) {
        lines.push(`  [${models.length}] ${reason}`);
        lines.push(`      ${models.join(', ')}`);
    }
    process.stdout.write(lines.join('\n') + '\n');
}

async function runConformance(options) {
    common.loadOrt(); // the install hint, before any work
    const models = listModels(options);
    if (models.length === 0) throw new OracleError(`conformance.js: no models under ${options.data} match '${options.filter}'`);
    fs.mkdirSync(options.out, { recursive: true });
    const worker = new OrtWorker(options.timeout);
    const records = [];
    const started = Date.now();
    try {
        for (let i = 0; i < models.length; i++) {
            const record = await processModel(models[i], options, worker);
            records.push(record);
            if (options.verbose || record.status === 'fail') {
                const why = record.status === 'pass' ? '' : `: ${[...record.failures, ...record.skips].join('; ')}`;
                process.stderr.write(`[${i + 1}/${models.length}] ${record.model} ${record.status.toUpperCase()}${why}\n`);
            } else if ((i + 1) % 100 === 0) {
                process.stderr.write(`[${i + 1}/${models.length}] ${((Date.now() - started) / 1000).toFixed(0)} s\n`);
            }
        }
    } finally {
        worker.stop();
    }
    const seconds = (Date.now() - started) / 1000;
    const count = status => records.filter(r => r.status === status).length;
    const summary = {
        models: records.length,
        checked: records.filter(r => r.checked).length,
        passed: count('pass'),
        failed: count('fail'),
        skipped: count('skip'),
        seconds,
        rules: options.rules,
        comparison: options.rules === 'none' ? 'bitwise' : { atol: options.atol, rtol: options.rtol },
    };
    fs.writeFileSync(path.join(options.out, 'conformance.json'), JSON.stringify({ summary, records }, null, 1) + '\n');

    const failed = records.filter(r => r.status === 'fail');
    if (failed.length > 0) {
        process.stdout.write(`failures (${failed.length}):\n` +
            failed.map(r => `  ${r.model}: ${r.failures.join('; ')}`).join('\n') + '\n');
    }
    printGroups(`skipped, not compared in ONNX Runtime (${summary.skipped} models), by reason:`,
        groupByReason(records.filter(r => r.status === 'skip'), 'skips'));
    printGroups('checker step skipped (the checker rejects the original model too), by reason:',
        groupByReason(records, 'checkerSkips'));
    process.stdout.write(`results: ${path.join(options.out, 'conformance.json')} (${seconds.toFixed(1)} s)\n`);
    process.stdout.write(`conformance: ${summary.models} models, ${summary.checked} checked, ${summary.passed} passed, ` +
        `${summary.failed} failed, ${summary.skipped} skipped\n`);
    return summary.failed > 0 ? 1 : 0;
}

if (require.main === module) {
    if (process.argv[2] === '--worker') {
        runWorker();
    } else {
        (async () => runConformance(parseArgs(process.argv.slice(2))))().then(code => { process.exitCode = code; },
            error => {
                const message = error instanceof OracleError ? error.message
                    : `conformance.js: ${common.firstLine(error && error.stack || error)}`;
                process.stderr.write(`${message}\n`);
                process.exitCode = 2;
            });
    }
}
