#!/usr/bin/env node
'use strict';
// Conformance run of bnfold over the ONNX backend test models (Debian's libonnx-testdata): fold every model, check
// the result with the ONNX checker, and compare original and folded outputs in ONNX Runtime on the test data
// inputs. Every model that cannot be compared is listed with the reason. See README.md.
// Several --rules runs share one pass over the models: each model, its test data, its checker verdict and its
// outputs in ONNX Runtime are read and computed once, then every run's fold of it is judged against them.
//
// ONNX Runtime runs in a forked worker (this file with --worker) so that a crash or hang inside ORT costs one
// model, not the whole run.

const childProcess = require('child_process');
const fs = require('fs');
const os = require('os');
const path = require('path');
const common = require('./common');
const { OracleError } = common;

const USAGE = `usage: conformance.js --bnfold PATH --checker PATH [--rules RULES]... [--out DIR] [--filter SUBSTR]
                      [--atol X] [--rtol Y] [--data DIR] [--suites a,b,...] [--timeout SECONDS] [--sample N] [--verify]
                      [--verbose] [--results-only]
       conformance.js --summary DIR --rules RULES
  --verify   runs fold with --verify: every rewrite must also pass bnfold's own numeric check
  --sample N keeps every model whose name says BatchNormalization, Conv, Gemm or MatMul (the ops the rules rewrite)
             and every Nth of the others (default 1: all); the same models in every run
  --rules none (default) requires bitwise-identical outputs; any other value uses --atol/--rtol (default 1e-5);
             given several times, each is a run of its own over the same pass
  --results-only exits 0 once DIR/conformance.json is written, failures or not (for --summary to judge)
  --summary  prints the failures, skips and counts of one --rules run from DIR/conformance.json; exit 1 on a
             failure, 2 when that run is not in it`;

const DEFAULTS = {
    rules: [],
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
    resultsOnly: false,
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
 * Runs the original on every data set (any problem there is a skip: the oracle cannot judge), then each output on
 * the same feeds (any problem there is a failure of that output) and compares. Reports each output's result as it
 * is known, so that a crash on one output leaves the others' results.
 */
async function compareInOrt(job, report) {
    let original = null;
    const skip = reason => ({ status: 'skip', reason });
    const fail = reason => ({ status: 'fail', reason });
    const skipAll = reason => job.outputs.forEach((_, k) => report({ index: k, result: skip(reason) }));
    try {
        try {
            original = await common.createSession(job.original);
        } catch (e) {
            return skipAll(`ORT cannot load the original: ${e.detail}`);
        }
        const feedSets = [];
        try {
            common.requireTensorInputs(original, 'original');
            common.requireTensorOutputs(original, 'original');
            if (job.dataSets.length === 0) feedSets.push(common.randomFeeds(original, 0, 'original'));
            for (const dir of job.dataSets) feedSets.push(common.feedsFromDataSet(original, dir));
        } catch (e) {
            // Drop the "original: " or "<data set folder>: " prefix; the record names the model.
            return skipAll(e.message.replace(/^(original|\/\S*): /, ''));
        }
        const originalOutputs = [];
        for (const feeds of feedSets) {
            try {
                originalOutputs.push(await common.runSession(original, feeds, job.original));
            } catch (e) {
                return skipAll(`ORT cannot run the original: ${e.detail}`);
            }
        }
        for (let index = 0; index < job.outputs.length; index++) {
            report({ index, stage: 'running' });
            const result = await compareOutput(job.outputs[index], original, feedSets, originalOutputs)
                .catch(e => fail(`internal error: ${common.firstLine(e && e.stack || e)}`));
            report({ index, result });
        }
    } catch (e) {
        skipAll(`internal error: ${common.firstLine(e && e.stack || e)}`);
    } finally {
        common.releaseSession(original);
    }
}

/** One output model against the original's outputs on the same feeds. */
async function compareOutput(spec, original, feedSets, originalOutputs) {
    const fail = reason => ({ status: 'fail', reason });
    let output = null;
    try {
        try {
            output = await common.createSession(spec.output);
        } catch (e) {
            return fail(`ORT cannot load the output: ${e.detail}`);
        }
        const tolerance = spec.exact ? { exact: true } : { atol: spec.atol, rtol: spec.rtol };
        const perRun = [];
        for (let k = 0; k < feedSets.length; k++) {
            let outputs;
            try {
                outputs = await common.runSession(output, pickFeeds(feedSets[k], output), spec.output);
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
    } finally {
        common.releaseSession(output);
    }
}

function runWorker() {
    process.on('message', async job => {
        await compareInOrt(job, message => process.send({ id: job.id, ...message }));
        process.send({ id: job.id, done: true });
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
    /** Resolves with one result per output of the job, or skips/fails telling how ORT died. */
    run(job) {
        if (!this.child) this.start();
        const child = this.child;
        const id = this.nextId++;
        return new Promise(resolve => {
            const results = new Array(job.outputs.length).fill(null);
            let running = -1;
            let settled = false;
            const finish = () => {
                if (settled) return;
                settled = true;
                clearTimeout(timer);
                child.removeListener('message', onMessage);
                child.removeListener('exit', onExit);
                resolve(results);
            };
            // A crash while running the original says nothing about bnfold; a crash on an output does, about that
            // output only: the outputs after it were not compared.
            const died = what => {
                for (let k = 0; k < results.length; k++) {
                    if (results[k]) continue;
                    if (running < 0) results[k] = { status: 'skip', reason: `ORT ${what} on the original model` };
                    else if (k === running) results[k] = { status: 'fail', reason: `ORT ${what} on the output model` };
                    else results[k] = { status: 'skip', reason: `not compared: ORT ${what} on another output model` };
                }
                finish();
            };
            const onMessage = message => {
                if (message.id !== id) return;
                if (message.stage === 'running') running = message.index;
                if (message.result && !results[message.index]) results[message.index] = message.result;
                if (message.done) finish();
            };
            const onExit = (code, signal) => {
                this.child = null;
                died(signal ? `crashed (${signal})` : `exited with code ${code}`);
            };
            const timer = setTimeout(() => {
                child.removeListener('exit', onExit);
                child.kill('SIGKILL');
                this.child = null;
                died(`timed out after ${this.timeoutMs / 1000} s`);
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
            case '--rules': options.rules = options.rules.concat([value()]); break;
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
            case '--results-only': options.resultsOnly = true; break;
            case '--summary': options.summary = value(); break;
            case '-h': case '--help': process.stdout.write(USAGE + '\n'); process.exit(0); break;
            default: usageError(`unknown argument ${arg}`);
        }
    }
    if (options.rules.length === 0) options.rules = ['none'];
    if (new Set(options.rules).size !== options.rules.length) usageError('a --rules value is given twice');
    if (options.summary !== undefined) {
        if (options.rules.length !== 1) usageError('--summary needs exactly one --rules');
        return options;
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

/**
 * One long-lived `bnfold_onnx_check --serve` answering a path per line: libonnx registers every op schema at
 * start-up, which costs more than checking a small model, so one process serves the whole run. Requests are
 * answered in order; a checker that crashes or times out fails the request it was on and is started again for the
 * rest.
 */
class CheckerServer {
    constructor(checker, timeoutSeconds) {
        this.checker = checker;
        this.timeoutMs = timeoutSeconds * 1000;
        this.child = null;
        this.queue = [];  // requests written to the current child, oldest first: { file, resolve }
        this.buffered = '';
        this.timer = null;
    }
    start() {
        const child = childProcess.spawn(this.checker, ['--serve'], { stdio: ['pipe', 'pipe', 'inherit'] });
        this.child = child;
        this.buffered = '';
        child.stdout.setEncoding('utf8');
        child.stdout.on('data', chunk => {
            if (child !== this.child) return;
            this.buffered += chunk;
            let newline;
            while ((newline = this.buffered.indexOf('\n')) >= 0) {
                const line = this.buffered.slice(0, newline);
                this.buffered = this.buffered.slice(newline + 1);
                this.answer(line);
            }
        });
        child.on('exit', (code, signal) => {
            if (child !== this.child) return;
            this.died(signal ? `crashed (${signal})` : `exited with code ${code}`);
        });
        child.stdin.on('error', () => {});  // a dead child's pipe: its exit handler deals with the requests
    }
    /** Resolves with { ok: true } or { ok: false, message }. */
    check(file) {
        return new Promise(resolve => {
            if (!this.child) this.start();
            this.queue.push({ file, resolve });
            this.child.stdin.write(`${file}\n`);
            if (this.queue.length === 1) this.armTimer();
        });
    }
    armTimer() {
        clearTimeout(this.timer);
        if (this.queue.length === 0) return;
        this.timer = setTimeout(() => {
            const child = this.child;
            this.died(`timed out after ${this.timeoutMs / 1000} s`);
            if (child) child.kill('SIGKILL');
        }, this.timeoutMs);
    }
    answer(line) {
        const request = this.queue.shift();
        if (!request) return;
        const space = line.indexOf(' ');
        const verdict = space < 0 ? line : line.slice(0, space);
        const message = space < 0 ? '' : line.slice(space + 1);
        if (verdict === 'ok') request.resolve({ ok: true });
        else request.resolve({ ok: false, message: `${message} (exit ${verdict === 'fail' ? 1 : 2})` });
        this.armTimer();
    }
    /** The request the checker was on fails; the others go to a new checker. */
    died(what) {
        clearTimeout(this.timer);
        this.child = null;
        const [current, ...rest] = this.queue;
        this.queue = [];
        if (current) current.resolve({ ok: false, message: `the checker ${what} (on ${current.file})` });
        if (rest.length === 0) return;
        this.start();
        for (const request of rest) {
            this.queue.push(request);
            this.child.stdin.write(`${request.file}\n`);
        }
        this.armTimer();
    }
    stop() {
        clearTimeout(this.timer);
        if (this.child) this.child.stdin.end();
        this.child = null;
    }
}

/** bnfold's fold of one model with one --rules value: the failures it shows before any comparison. */
function foldModel(entry, rules, options) {
    const outDir = path.join(options.out, entry.suite);
    const base = path.join(outDir, `${entry.name}.rules-${rules}`);
    const fold = { rules, outModel: `${base}.onnx`, outReport: `${base}.json`, failures: [] };
    fs.mkdirSync(outDir, { recursive: true });
    for (const stale of [fold.outModel, fold.outReport]) fs.rmSync(stale, { force: true });
    const run = childProcess.spawnSync(options.bnfold,
        ['fold', entry.model, '-o', fold.outModel, '--report', fold.outReport, '--rules', rules, '-q']
            .concat(options.verify ? ['--verify'] : []),
        { encoding: 'utf8', timeout: options.timeout * 1000, maxBuffer: 64 << 20 });
    fold.bnfold = { exit: run.status, signal: run.signal || undefined, stderr: (run.stderr || '').trim() };
    if (run.status !== 0) {
        fold.failures.push(`bnfold ${describeExit(run)}: ${toolMessage(run.stderr, run.stdout)}`);
    } else if (!fs.existsSync(fold.outModel)) {
        fold.failures.push('bnfold exited 0 but wrote no output model');
    } else if (!fs.existsSync(fold.outReport)) {
        fold.failures.push('bnfold exited 0 but wrote no report');
    } else {
        try {
            JSON.parse(fs.readFileSync(fold.outReport, 'utf8'));
        } catch (e) {
            fold.failures.push(`the report is not valid JSON: ${common.firstLine(e.message)}`);
        }
    }
    return fold;
}

/** Folds one model with every --rules value and judges each result. Returns one record per --rules value. */
async function processModel(entry, options, worker, checker) {
    const folds = options.rules.map(rules => foldModel(entry, rules, options));
    const records = folds.map(fold => ({ model: entry.id, status: 'pass', failures: fold.failures, skips: [],
        checkerSkips: [], bnfold: fold.bnfold }));
    const compared = folds.map((fold, k) => k).filter(k => records[k].failures.length === 0);
    for (const k of records.keys()) if (!compared.includes(k)) records[k].status = 'fail';
    if (compared.length === 0) return records;

    // b. checker on the original once and on each output, running while ORT works (c, d)
    const checks = Promise.all([checker.check(entry.model)]
        .concat(compared.map(k => checker.check(folds[k].outModel))));
    const ort = worker.run({
        original: entry.model,
        dataSets: common.listDataSets(entry.dir),
        outputs: compared.map(k => ({ output: folds[k].outModel, exact: options.rules[k] === 'none',
            atol: options.atol, rtol: options.rtol })),
    });
    const [[checkOriginal, ...checkOutputs], ortResults] = await Promise.all([checks, ort]);
    compared.forEach((k, j) => {
        const record = records[k], checkOutput = checkOutputs[j], ortResult = ortResults[j];
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
    });
    return records;
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

function summarize(records, rules, options, seconds) {
    const count = status => records.filter(r => r.status === status).length;
    return {
        models: records.length,
        checked: records.filter(r => r.checked).length,
        passed: count('pass'),
        failed: count('fail'),
        skipped: count('skip'),
        seconds,
        rules,
        comparison: rules === 'none' ? 'bitwise' : { atol: options.atol, rtol: options.rtol },
    };
}

/** Failures, skips by reason and the counts of one --rules run; returns the exit code it deserves. */
function printRun(run, resultsFile) {
    const { summary, records } = run;
    const failed = records.filter(r => r.status === 'fail');
    if (failed.length > 0) {
        process.stdout.write(`failures (${failed.length}):\n` +
            failed.map(r => `  ${r.model}: ${r.failures.join('; ')}`).join('\n') + '\n');
    }
    printGroups(`skipped, not compared in ONNX Runtime (${summary.skipped} models), by reason:`,
        groupByReason(records.filter(r => r.status === 'skip'), 'skips'));
    printGroups('checker step skipped (the checker rejects the original model too), by reason:',
        groupByReason(records, 'checkerSkips'));
    process.stdout.write(`results: ${resultsFile} (${summary.seconds.toFixed(1)} s for the whole pass)\n`);
    process.stdout.write(`conformance (--rules ${summary.rules}): ${summary.models} models, ${summary.checked} checked, ` +
        `${summary.passed} passed, ${summary.failed} failed, ${summary.skipped} skipped\n`);
    return summary.failed > 0 ? 1 : 0;
}

async function runConformance(options) {
    common.loadOrt(); // the install hint, before any work
    const models = listModels(options);
    if (models.length === 0) throw new OracleError(`conformance.js: no models under ${options.data} match '${options.filter}'`);
    fs.mkdirSync(options.out, { recursive: true });
    const worker = new OrtWorker(options.timeout);
    const checker = new CheckerServer(options.checker, options.timeout);
    const recordsByRun = options.rules.map(() => []);
    const started = Date.now();
    try {
        for (let i = 0; i < models.length; i++) {
            const records = await processModel(models[i], options, worker, checker);
            records.forEach((record, k) => {
                recordsByRun[k].push(record);
                if (options.verbose || record.status === 'fail') {
                    const why = record.status === 'pass' ? '' : `: ${[...record.failures, ...record.skips].join('; ')}`;
                    process.stderr.write(`[${i + 1}/${models.length}] ${record.model} --rules ${options.rules[k]} ` +
                        `${record.status.toUpperCase()}${why}\n`);
                }
            });
            if (!options.verbose && (i + 1) % 100 === 0) {
                process.stderr.write(`[${i + 1}/${models.length}] ${((Date.now() - started) / 1000).toFixed(0)} s\n`);
            }
        }
    } finally {
        worker.stop();
        checker.stop();
    }
    const seconds = (Date.now() - started) / 1000;
    const runs = options.rules.map((rules, k) => ({ summary: summarize(recordsByRun[k], rules, options, seconds),
        records: recordsByRun[k] }));
    const resultsFile = path.join(options.out, 'conformance.json');
    fs.writeFileSync(resultsFile, JSON.stringify({ runs }, null, 1) + '\n');
    const codes = runs.map(run => printRun(run, resultsFile));
    return options.resultsOnly ? 0 : Math.max(...codes);
}

/** --summary: judges one run of a pass written with --results-only. */
function printSummary(options) {
    const resultsFile = path.join(path.resolve(options.summary), 'conformance.json');
    let runs;
    try {
        runs = JSON.parse(fs.readFileSync(resultsFile, 'utf8')).runs;
    } catch (e) {
        throw new OracleError(`conformance.js: ${resultsFile}: cannot read the results: ${common.firstLine(e.message)}`);
    }
    const run = (runs || []).find(r => r.summary.rules === options.rules[0]);
    if (!run) throw new OracleError(`conformance.js: ${resultsFile} has no run with --rules ${options.rules[0]}`);
    return printRun(run, resultsFile);
}

if (require.main === module) {
    if (process.argv[2] === '--worker') {
        runWorker();
    } else {
        (async () => {
            const options = parseArgs(process.argv.slice(2));
            return options.summary !== undefined ? printSummary(options) : runConformance(options);
        })().then(code => { process.exitCode = code; },
            error => {
                const message = error instanceof OracleError ? error.message
                    : `conformance.js: ${common.firstLine(error && error.stack || error)}`;
                process.stderr.write(`${message}\n`);
                process.exitCode = 2;
            });
    }
}
