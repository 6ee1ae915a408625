import * as childProcess from 'child_process';
import * as os from 'os';
import * as path from 'path';
import { CheckerConfig, CONFIGS, configNamed } from './configs';
import { Budget, Model, RecordedUpdate } from './model';
import { search, SearchOptions, SearchResult } from './search';
import { buildSystem, System } from './system';

/*
 * `npm run check-protocol`: search every interleaving of the bounded configurations (checker/configs.ts)
 * and print, for each, the states searched and the time; on a violation, the shortest trace that
 * leads to it, step by step, with the lock item after each step.
 *
 *   npm run check-protocol                          all configurations
 *   npm run check-protocol -- queue-stops polling    some of them
 *   npm run check-protocol -- queue-stops --budget '{"stops":2}' --executions 3   larger bounds
 *   npm run check-protocol -- --list
 *   npm run check-protocol -- queue-stops --tickets 4     a wider window of ticket numbers (default 1, or the configuration's)
 *   npm run check-protocol -- --jobs 1                one process (by default, one per core, up to two)
 *   npm run check-protocol -- --bound 20000           each search stopped after 20,000 states (the test command's;
 *                                                     CI's is 50000)
 */

export interface CheckOptions extends SearchOptions {
  /** Told of every UpdateItem the model evaluates. */
  readonly onUpdateItem?: (call: RecordedUpdate) => void;
  /** Change the synthesized system before the search (to check that the checker finds a planted bug). */
  readonly mutate?: (system: System) => System;
  /** The widest window of ticket numbers a world may name (checker/model.ts, DEFAULT_TICKET_WINDOW). */
  readonly ticketWindow?: number;
}

export function checkConfig(config: CheckerConfig, options: CheckOptions = {}): SearchResult {
  const built = buildSystem(config.workflow);
  const system = options.mutate ? options.mutate(built) : built;
  const { executions, clients, clientPermits, clientCollects, budget } = config;
  const ticketWindow = options.ticketWindow ?? config.ticketWindow;
  const model = new Model({ system, executions, clients, clientPermits, clientCollects, budget, onUpdateItem: options.onUpdateItem, ticketWindow });
  return search(model, options);
}

/** A result as text: the figures, and the counterexample if there is one. */
export function report(config: CheckerConfig, result: SearchResult): string {
  const lines = [
    `${config.name}: ${result.counterexample ? 'VIOLATION' : result.incomplete ? 'INCOMPLETE' : result.bounded ? 'ok to its bound' : 'ok'} — ` +
      `${result.states.toLocaleString('en-US')} states, ${result.transitions.toLocaleString('en-US')} transitions, ` +
      `${result.bounded ? `every interleaving of up to ${result.maxDepth} steps` : `depth ${result.maxDepth}`}, ${result.seconds.toFixed(1)} s`,
  ];
  const c = result.counterexample;
  if (c) {
    lines.push(`  ${c.violation.split('\n').join('\n  ')}`, '  trace (shortest):');
    c.trace.forEach((step, i) => lines.push(`  ${String(i + 1).padStart(3)}. ${step.label}`, `         lock: ${step.lock}`));
    if (c.fairRun) {
      lines.push('  then, with no more faults, the fair run:');
      c.fairRun.forEach((step) => lines.push(`       ${step.label}`, `         lock: ${step.lock}`));
    }
  }
  return lines.join('\n');
}

function main(argv: string[]): number | Promise<number> {
  if (argv.includes('--help')) {
    console.log(
      'usage: npm run check-protocol -- [config ...] [--list] [--budget JSON] [--executions N] [--max-states N] [--bound N] [--tickets N] [--no-liveness] [--jobs N]',
    );
    console.log('  --bound N    stop each search after N states and pass if nothing broke (the test command\'s quick search; see the README)');
    return 0;
  }
  if (argv.includes('--list')) {
    for (const c of CONFIGS) console.log(`${c.name.padEnd(22)} ${c.description}`);
    return 0;
  }
  const value = (flag: string) => {
    const i = argv.indexOf(flag);
    return i >= 0 ? argv[i + 1] : undefined;
  };
  const flagged = new Set(['--budget', '--executions', '--max-states', '--bound', '--jobs', '--tickets'].flatMap((f) => [f, value(f)]));
  const names = argv.filter((a) => !a.startsWith('--') && !flagged.has(a));
  const positive = (flag: string) => {
    const n = Number(value(flag));
    if (!Number.isInteger(n) || n <= 0) throw new Error(`${flag} must be a positive whole number of states, not '${value(flag)}'`);
    return n;
  };
  const budget = value('--budget') ? (JSON.parse(value('--budget')!) as Partial<Budget>) : {};
  const executions = value('--executions') ? Number(value('--executions')) : undefined;
  const configs = (names.length ? names.map(configNamed) : CONFIGS).map((c) => ({
    ...c,
    budget: { ...c.budget, ...budget },
    executions: executions ?? c.executions,
  }));
  const started = Date.now();
  const check = (config: CheckerConfig, progress: boolean): WorkerResult => {
    const result = checkConfig(config, {
      maxStates: value('--max-states') ? Number(value('--max-states')) : undefined,
      bound: value('--bound') ? positive('--bound') : undefined,
      ticketWindow: value('--tickets') ? Number(value('--tickets')) : undefined,
      liveness: !argv.includes('--no-liveness'),
      progress: progress ? (n, d) => process.stderr.write(`  ${config.name}: ${n.toLocaleString('en-US')} states, depth ${d}\r`) : undefined,
    });
    return { name: config.name, text: report(config, result), states: result.states, failed: Boolean(result.counterexample || result.incomplete) };
  };
  if (argv.includes('--worker')) {
    // A worker of runInParallel: it searches each configuration it is sent, and answers with the result.
    process.on('message', (name: string) => process.send!(check(configs.find((c) => c.name === name)!, false)));
    return new Promise<number>((resolve) => process.on('disconnect', () => resolve(0)));
  }
  const jobs = Math.min(Number(value('--jobs') ?? DEFAULT_JOBS), configs.length);
  if (jobs > 1) return runInParallel(configs, jobs, argv, started);
  let failed = 0;
  let states = 0;
  for (const config of configs) {
    const result = check(config, true);
    states += result.states;
    console.log(result.text);
    if (result.failed) failed++;
  }
  console.log(summary(configs.length, states, started, failed));
  return failed ? 1 : 0;
}

/** What a worker answers for one configuration. */
interface WorkerResult {
  readonly name: string;
  readonly text: string;
  readonly states: number;
  readonly failed: boolean;
}

/** One search per core. */
const DEFAULT_JOBS = Math.min(2, os.cpus().length);

function summary(configurations: number, states: number, started: number, failed: number): string {
  const seconds = ((Date.now() - started) / 1000).toFixed(1);
  return `\n${configurations} configurations, ${states.toLocaleString('en-US')} states in ${seconds} s: ${failed ? `${failed} failed` : 'no violation'}`;
}

/**
 * Run the configurations in `jobs` child processes (this file, with --worker), each sent the next
 * configuration as soon as it is done with one (a fixed split left one process searching for two and a
 * half minutes after the other had finished), and report them in their order, as one run would.
 */
async function runInParallel(configs: CheckerConfig[], jobs: number, argv: string[], started: number): Promise<number> {
  const flags = argv.filter((a, i) => !configs.some((c) => c.name === a) && a !== '--jobs' && argv[i - 1] !== '--jobs');
  const waiting = [...configs];
  const results = new Map<string, WorkerResult>();
  const lost: string[] = [];
  await Promise.all(
    Array.from(
      { length: jobs },
      () =>
        new Promise<void>((resolve) => {
          const child = childProcess.fork(__filename, [...configs.map((c) => c.name), ...flags, '--worker'], {
            execArgv: ['-r', 'ts-node/register/transpile-only'],
            env: { ...process.env, TS_NODE_PROJECT: path.join(__dirname, '..', 'tsconfig.dev.json') },
            stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
          });
          let current: CheckerConfig | undefined;
          const next = () => {
            current = waiting.shift();
            if (current) child.send(current.name);
            else child.disconnect();
          };
          child.on('message', (result: WorkerResult) => {
            results.set(result.name, result);
            next();
          });
          // A worker that died (out of memory, a crash) or never started failed the configuration it had.
          const ended = () => {
            if (current && !results.has(current.name) && !lost.includes(current.name)) lost.push(current.name);
            resolve();
          };
          child.on('exit', ended);
          child.on('error', (e) => {
            console.error(`a checker process failed: ${e.message}`);
            ended();
          });
          next();
        }),
    ),
  );
  let states = 0;
  let failed = 0;
  for (const config of configs) {
    const result = results.get(config.name);
    if (result === undefined) {
      failed++;
      console.log(`${config.name}: NOT SEARCHED — ${lost.includes(config.name) ? 'its process died while searching it' : 'every process had died'}`);
      continue;
    }
    states += result.states;
    if (result.failed) failed++;
    console.log(result.text);
  }
  console.log(summary(configs.length, states, started, failed) + (lost.length ? ` (a process died searching ${lost.join(', ')})` : ''));
  return failed ? 1 : 0;
}

if (require.main === module) {
  void Promise.resolve(main(process.argv.slice(2))).then((code) => (process.exitCode = code));
}
