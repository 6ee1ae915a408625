import { CfnElement } from 'aws-cdk-lib';
import { ACQUIRE_STATES, BODY_ENTER, BODY_LEAVE, BODY_SLOT_ENTER, BODY_SLOT_LEAVE, brokenInvariants, LOCK_LAYOUT, runScenario, ScenarioResult, Subject } from '../simulator';
import { ConcurrencyControlledWorkflowProps } from '../src';
import { demoApp } from './app';

/*
 * npm run demo [-- --executions 100 --limit 5 --failure-rate 0.1 --abort-rate 0 --lost-event-rate 0 --seed 1]
 *
 * Synthesizes the example app (demo/app.ts) and runs it in the local simulator: many executions at
 * once contend for the semaphore, as the AWS sample's Run100Executions does. Shows the executions
 * waiting, inside and done as they go, then a summary. Exits non-zero if an invariant broke.
 */

interface DemoOptions {
  executions: number;
  limit: number;
  failureRate: number;
  abortRate: number;
  lostEventRate: number;
  seed: number;
  workSeconds: number;
  timeScale: number;
}

const DEFAULTS: DemoOptions = {
  executions: 100,
  limit: 5,
  failureRate: 0.1,
  abortRate: 0,
  lostEventRate: 0,
  seed: 1,
  workSeconds: 15,
  // Slow enough that the simulator's own CPU time does not inflate the drain time (about 18 s).
  timeScale: 0.05,
};

const HELP = `Usage: npm run demo -- [options]

Runs the example app (a workflow with a concurrency limit) in the local simulator.

Options:
  --executions N        executions started at once (default ${DEFAULTS.executions})
  --limit N             concurrency limit (default ${DEFAULTS.limit})
  --failure-rate P      share of executions whose work fails (default ${DEFAULTS.failureRate})
  --abort-rate P        share of executions stopped at a random moment (default ${DEFAULTS.abortRate})
  --lost-event-rate P   share of status-change events EventBridge loses (default ${DEFAULTS.lostEventRate})
  --seed N              seed of every random draw (default ${DEFAULTS.seed})
  --work-seconds S      mean work time, simulated seconds (default ${DEFAULTS.workSeconds})
  --time-scale F        real seconds per simulated second (default ${DEFAULTS.timeScale})
  --help                this text`;

export function parseOptions(argv: string[]): DemoOptions {
  const options = { ...DEFAULTS };
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i];
    if (arg === '--help' || arg === '-h') {
      console.log(HELP);
      process.exit(0);
    }
    const key = arg.replace(/^--/, '').replace(/-([a-z])/g, (_, c: string) => c.toUpperCase()) as keyof DemoOptions;
    if (!arg.startsWith('--') || !(key in DEFAULTS)) {
      throw new Error(`unknown option ${arg} (try --help)`);
    }
    const value = Number(argv[++i]);
    const isRate = key.endsWith('Rate');
    if (!Number.isFinite(value) || value < 0 || (isRate && value > 1) || (['executions', 'limit'].includes(key) && (!Number.isInteger(value) || value < 1))) {
      throw new Error(`${arg} must be ${isRate ? 'a probability from 0 to 1' : 'a positive number'}, got: ${argv[i]}`);
    }
    options[key] = value;
  }
  return options;
}

/** Our workflow in the demo app, as the scenario runner sees it. */
export function demoSubject(limit: number, props: Partial<ConcurrencyControlledWorkflowProps> = {}): Subject {
  const { stack, workflow } = demoApp(limit, props);
  const id = (c: CfnElement) => stack.getLogicalId(c);
  // A rate's count other than the limit: the limit counts the bodies in their slots, and the rate's permits
  // are held for another span (longer below the count, shorter above it). A rate alone (the props unset
  // `concurrencyLimit`) has no slots: its bodies run in the protected body, beside the permits.
  const concurrencyLimit = 'concurrencyLimit' in props ? props.concurrencyLimit : limit;
  const slots = props.rateLimit !== undefined && concurrencyLimit !== undefined && concurrencyLimit !== props.rateLimit.count;
  return {
    name: 'cdk-sfn-semaphore',
    stack,
    stateMachine: id(workflow.stateMachine.node.defaultChild as CfnElement),
    table: id(workflow.table.table.node.defaultChild as CfnElement),
    layout: LOCK_LAYOUT,
    enterStates: slots ? BODY_SLOT_ENTER : BODY_ENTER,
    leaveStates: slots ? BODY_SLOT_LEAVE : BODY_LEAVE,
    acquireStates: ACQUIRE_STATES,
    bodyStates: ['Run Work'],
    bodyFunctions: ['WorkFunction'],
  };
}

export function summaryTable(result: ScenarioResult, limit: number): string {
  const rows: Array<[string, string]> = [
    ['executions', `${result.executions}`],
    ['succeeded / failed / aborted', `${result.succeeded} / ${result.failed} / ${result.aborted}`],
    ['most inside at once', `${result.maxInside} (limit ${limit})`],
    ['permits left held', `${result.permitsLeftHeld} (after the reconciler's run, which reclaimed ${result.reclaimedByReconciler})`],
    ['transitions per execution', `${result.transitionsPerExecution.toFixed(1)} (${result.overheadTransitionsPerExecution.toFixed(1)} beside the body)`],
    ['DynamoDB calls per execution', result.dynamoCallsPerExecution.toFixed(1)],
    ['capacity per execution', `${result.writeUnitsPerExecution.toFixed(1)} WCU, ${result.readUnitsPerExecution.toFixed(1)} RCU (lock item up to ${(result.largestLockItemBytes / 1024).toFixed(1)} KB)`],
    ['cost per 1,000 executions', `$${result.dollarsPer1000.toFixed(3)} (transitions, capacity and Lambda beside the body)`],
    ['cleanup executions', `${result.cleanupExecutions} (${result.cleanupDynamoCalls} DynamoDB calls)`],
    ['drain time', `${result.drainSeconds.toFixed(0)} s, ${result.drainRatio.toFixed(2)}x the ideal ${result.idealSeconds} s`],
  ];
  const width = Math.max(...rows.map(([k]) => k.length));
  return rows.map(([k, v]) => `  ${k.padEnd(width)}  ${v}`).join('\n');
}

async function main(): Promise<number> {
  const options = parseOptions(process.argv.slice(2));
  console.log(
    `cdk-sfn-semaphore demo: ${options.executions} executions, limit ${options.limit}, ` +
      `${options.failureRate * 100}% failing work, ${options.abortRate * 100}% stopped, ` +
      `${options.lostEventRate * 100}% of events lost, seed ${options.seed} (simulated time, ${1 / options.timeScale}x)`,
  );
  const live = process.stdout.isTTY;
  let lastLine = 0;
  const result = await runScenario(demoSubject(options.limit), {
    executions: options.executions,
    limit: options.limit,
    workSeconds: options.workSeconds,
    failureRate: options.failureRate,
    abortRate: options.abortRate,
    lostEventRate: options.lostEventRate,
    seed: options.seed,
    timeScale: options.timeScale,
    onProgress: (p) => {
      const line = `  t=${p.simulatedSeconds.toFixed(0).padStart(4)}s  waiting ${String(p.waiting).padStart(3)}  inside ${p.inside}  done ${String(p.done).padStart(3)}  permits in use ${p.permitsInUse}/${options.limit}`;
      if (live) {
        process.stdout.write(`\r${line}`);
      } else if (Date.now() - lastLine > 2000) {
        // Not a terminal (CI, a pipe): a line every two seconds instead of one redrawn in place.
        console.log(line);
        lastLine = Date.now();
      }
    },
  });
  if (live) process.stdout.write('\n');
  console.log(`\nSummary (ran in ${result.realSeconds.toFixed(1)} s)\n${summaryTable(result, options.limit)}`);
  const broken = brokenInvariants(result, options.limit);
  if (broken.length > 0) {
    console.error(`\nInvariants broken:\n${broken.map((b) => `  - ${b}`).join('\n')}`);
    return 1;
  }
  console.log('\nEvery invariant held: never more than the limit inside, no permit left held, every failure explained.');
  return 0;
}

if (require.main === module) {
  main().then(
    (code) => process.exit(code),
    (e) => {
      console.error(e instanceof Error ? e.message : e);
      process.exit(2);
    },
  );
}
