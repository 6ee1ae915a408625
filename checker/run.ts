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
 */

export interface CheckOptions extends SearchOptions {
  /** Told of every UpdateItem the model evaluates. */
  readonly onUpdateItem?: (call: RecordedUpdate) => void;
  /** Change the synthesized system before the search (to check that the checker finds a planted bug). */
  readonly mutate?: (system: System) => System;
}

export function checkConfig(config: CheckerConfig, options: CheckOptions = {}): SearchResult {
  const built = buildSystem(config.workflow);
  const system = options.mutate ? options.mutate(built) : built;
  const { executions, clients, budget } = config;
  const model = new Model({ system, executions, clients, budget, onUpdateItem: options.onUpdateItem });
  return search(model, options);
}

/** A result as text: the figures, and the counterexample if there is one. */
export function report(config: CheckerConfig, result: SearchResult): string {
  const lines = [
    `${config.name}: ${result.counterexample ? 'VIOLATION' : result.incomplete ? 'INCOMPLETE' : 'ok'} — ${result.states.toLocaleString('en-US')} states, ` +
      `${result.transitions.toLocaleString('en-US')} transitions, depth ${result.maxDepth}, ${result.seconds.toFixed(1)} s`,
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

function main(argv: string[]): number {
  if (argv.includes('--help')) {
    console.log('usage: npm run check-protocol -- [config ...] [--list] [--budget JSON] [--executions N] [--max-states N] [--no-liveness]');
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
  const flagged = new Set(['--budget', '--executions', '--max-states'].flatMap((f) => [f, value(f)]));
  const names = argv.filter((a) => !a.startsWith('--') && !flagged.has(a));
  const budget = value('--budget') ? (JSON.parse(value('--budget')!) as Partial<Budget>) : {};
  const executions = value('--executions') ? Number(value('--executions')) : undefined;
  const configs = (names.length ? names.map(configNamed) : CONFIGS).map((c) => ({
    ...c,
    budget: { ...c.budget, ...budget },
    executions: executions ?? c.executions,
  }));
  let failed = 0;
  let states = 0;
  const started = Date.now();
  for (const config of configs) {
    const result = checkConfig(config, {
      maxStates: value('--max-states') ? Number(value('--max-states')) : undefined,
      liveness: !argv.includes('--no-liveness'),
      progress: (n, d) => process.stderr.write(`  ${config.name}: ${n.toLocaleString('en-US')} states, depth ${d}\r`),
    });
    states += result.states;
    console.log(report(config, result));
    if (result.counterexample || result.incomplete) failed++;
  }
  console.log(`\n${configs.length} configurations, ${states.toLocaleString('en-US')} states in ${((Date.now() - started) / 1000).toFixed(1)} s: ${failed ? `${failed} failed` : 'no violation'}`);
  return failed ? 1 : 0;
}

if (require.main === module) {
  process.exitCode = main(process.argv.slice(2));
}
