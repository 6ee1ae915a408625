import * as fs from 'fs';
import * as path from 'path';
import { App, CfnElement, Duration, Stack } from 'aws-cdk-lib';
import { JsonPath } from 'aws-cdk-lib/aws-stepfunctions';
import * as tasks from 'aws-cdk-lib/aws-stepfunctions-tasks';
import { Construct } from 'constructs';
import { workFunction } from '../demo/app';
import { demoSubject } from '../demo/run';
import { AWS_SAMPLE_LOCK_LAYOUT, runScenario, ScenarioOptions, ScenarioResult, Subject } from '../simulator';
import { ConcurrencyControlledWorkflowProps, RateLimit, WaitStrategy } from '../src';
import { AwsSampleSemaphore } from './aws-sample-baseline';
import { HOLDER_ITEMS_LAYOUT, HolderItemsSpike, SPIKE_STATES } from './holder-items-spike';
import { TRANSACT_QUEUE_LAYOUT, TRANSACT_QUEUE_STATES, TransactQueueSpike } from './transact-queue-spike';

/*
 * npm run bench [-- --only contending,throttling --seed 1 --time-scale 0.05 --soak]
 *
 * Runs each scenario three times in this one process, with the same seed, body and faults: for the
 * AWS sample's algorithm (bench/aws-sample-baseline.ts), for our workflow with the polling wait
 * strategy, and for our workflow with the queue. Prints a table of the figures and the
 * ratio queue / sample, and writes them as JSON to bench-results/.
 */

export interface Scenario {
  readonly name: string;
  readonly description: string;
  readonly options: Omit<ScenarioOptions, 'seed' | 'timeScale'>;
  /** Overrides --time-scale: a thousand polling executions need more real time per simulated second. */
  readonly timeScale?: number;
  /** Props of our workflow beside the wait strategy (the sample gets the scenario's limit only). */
  readonly props?: Partial<ConcurrencyControlledWorkflowProps>;
  /** Only our polling workflow runs it (weights wait by polling): the queue's column is empty. */
  readonly pollingOnly?: boolean;
  /** Only the queue runs it: the other columns are empty. */
  readonly queueOnly?: boolean;
}

const LIMIT = 5;
/**
 * The runs of 100 at limit 5, and the weights, at twice real time (not 20 times). At 20 times the
 * emulator answered polling's lockstep polls (95 executions polling one item every 3 s) in 680 ms of
 * simulated time at the median, so each execution polled less often than on AWS and its figures read
 * low: polling 86.5 transitions per execution and $2.16 per 1,000 at 20x, 100.7 and $2.52 at 5x, 109.1
 * and $2.74 at 2x (median call 48 ms); the sample 39.6, 41.7, 42.2; the queue 10.7 at every clock.
 * The weights' last executions arrived 7.6 to 19.4 s late at 20x, 0.6 to 1.5 s at 2x.
 */
const STANDARD_TIME_SCALE = 0.5;
/** The weights of the `weights` scenario: 1, 2, 3, 4, 1, 2, ... */
const weightOf = (id: number) => (id % 4) + 1;
const SCENARIOS: Scenario[] = [
  { name: 'uncontended', description: 'one execution, first use of the lock', options: { executions: 1, limit: LIMIT } },
  {
    name: 'contending',
    description: '100 executions at once, limit 5, work 15 s ± 20%',
    options: { executions: 100, limit: LIMIT },
    timeScale: STANDARD_TIME_SCALE,
  },
  {
    name: 'faults',
    description: '100 contending, 10% failing work, 10% stopped inside the body',
    options: { executions: 100, limit: LIMIT, failureRate: 0.1, abortInsideRate: 0.1 },
    timeScale: STANDARD_TIME_SCALE,
  },
  {
    name: 'lost-events',
    description: '100 contending, 10% stopped inside the body, 30% of status events lost',
    options: { executions: 100, limit: LIMIT, abortInsideRate: 0.1, lostEventRate: 0.3, horizonFactor: 3 },
    timeScale: STANDARD_TIME_SCALE,
  },
  {
    name: 'late-acquire',
    description: '100 at once, limit 100, DynamoDB calls land up to 10 s late, 20% stopped while an acquire is on its way',
    options: { executions: 100, limit: 100, abortAcquiringRate: 0.2, dynamoFaults: { maxLatencySeconds: 10 } },
    timeScale: STANDARD_TIME_SCALE,
  },
  {
    name: 'lost-wake-ups',
    description: '100 contending, 10% of wake-ups lost (found by the waiter after its 5 min check interval)',
    // A lost wake-up costs its waiter up to one check interval (5 min, the whole ideal drain here), and
    // the waiters queued behind the last releasers can lose theirs in turn: a waiter queued at 20 s
    // checks at 320, 620, 920 and 1,220 s, just past the default horizon (4 x 300 s), where it would
    // count as stuck while it holds its permit and is about to find it.
    options: { executions: 100, limit: LIMIT, lostWakeUpRate: 0.1, horizonFactor: 6 },
    timeScale: STANDARD_TIME_SCALE,
  },
  {
    name: 'throttling',
    description: '100 contending, 5% of DynamoDB calls throttled',
    options: { executions: 100, limit: LIMIT, dynamoFaults: { throttleRate: 0.05 } },
    timeScale: STANDARD_TIME_SCALE,
  },
  // A hot lock, under DynamoDB's partition limits (1,000 write units a second for one item).
  // At 1: the simulator cannot run 500 executions four times faster than real time on two cores (at 0.25 the queue's drain read 2.0× the ideal, at 1 1.11×).
  { name: 'hot-lock', description: '500 executions at once, limit 25, work 2 s', options: { executions: 500, limit: 25, workSeconds: 2 }, timeScale: 1 },
  // The rate limit (ours only: the sample has none, so its column is a concurrency limit of 5 around the
  // same bodies, which happens to pass about as many per second). Time runs at half speed, so that the
  // hand-offs' CPU time barely shows in a 40 s drain.
  {
    name: 'rate',
    description: '200 executions at once, at most 5 per second (RateLimit.perSecond(5)), work 1 s; polling every 1 s',
    options: { executions: 200, limit: 5, workSeconds: 1, workJitter: 0, rate: { count: 5, intervalSeconds: 1 } },
    props: { rateLimit: RateLimit.perSecond(5), pollInterval: Duration.seconds(1) },
    timeScale: 0.5,
  },
  // A rate alone with bodies five times its interval (ours only, as above; the sample's column is a
  // concurrency limit of 30 around the same bodies, 6 a second): the permits go back beside the bodies,
  // so about 25 run at once. Ideal: 200 at 5 a second, 40 s.
  {
    name: 'rate-long-bodies',
    description: '200 executions at once, at most 5 per second and no concurrency limit (RateLimit.perSecond(5)), work 5 s; polling every 1 s',
    options: { executions: 200, limit: 30, workSeconds: 5, workJitter: 0, rate: { count: 5, intervalSeconds: 1 } },
    props: { concurrencyLimit: undefined, rateLimit: RateLimit.perSecond(5), pollInterval: Duration.seconds(1) },
    timeScale: 0.5,
  },
  // A rate above the concurrency limit (ours only, as above): the bodies take body slots beside the
  // rate's permits, so that both limits are reached. Ideal: 200 at 10 a second, 20 s.
  {
    name: 'rate-beside-limit',
    description: '200 executions at once, at most 10 per second and 5 at once (RateLimit.perSecond(10), concurrencyLimit 5), work 0.2 s; polling every 1 s',
    options: { executions: 200, limit: 5, workSeconds: 0.2, workJitter: 0, rate: { count: 10, intervalSeconds: 1 } },
    props: { rateLimit: RateLimit.perSecond(10), pollInterval: Duration.seconds(1) },
    timeScale: 0.5,
  },
  // A concurrency limit above the rate's count (ours only, as above; the sample's column is a
  // concurrency limit of 20): the permits go back at the interval while the bodies keep their slots,
  // so up to 20 run at once. Ideal: the slots' 10 rounds of 5 s, 50 s (the rate alone's 40 s).
  {
    name: 'rate-above-limit',
    description: '200 executions at once, at most 5 per second and 20 at once (RateLimit.perSecond(5), concurrencyLimit 20), work 5 s; polling every 1 s',
    options: { executions: 200, limit: 20, workSeconds: 5, workJitter: 0, rate: { count: 5, intervalSeconds: 1 } },
    props: { rateLimit: RateLimit.perSecond(5), pollInterval: Duration.seconds(1) },
    timeScale: 0.5,
  },
  // Weighted permits (ours only: the sample has no weights, so its column is its own run of the same
  // executions taking one permit each). The queue serves them first come, first served (collectors).
  {
    name: 'weights',
    description: '200 executions at once, limit 10, taking 1 to 4 permits each (permits from the input), work 5 s, 10% failing, 10% stopped inside',
    options: {
      executions: 200,
      limit: 10,
      workSeconds: 5,
      failureRate: 0.1,
      abortInsideRate: 0.1,
      input: (id) => ({ weight: weightOf(id) }),
      permits: weightOf,
    },
    props: { permits: JsonPath.numberAt('$.weight'), pollInterval: Duration.seconds(2) },
    timeScale: STANDARD_TIME_SCALE,
  },
  {
    name: 'high-limit',
    description: '2,000 executions at once, limit 500, work 5 s: the sustained acquisitions per second',
    options: { executions: 2000, limit: 500, workSeconds: 5 },
    timeScale: 0.5,
  },
];

/**
 * Run only when named (`--only burst`): about 35 minutes here. In real time: at twice real time the
 * simulator fell behind its clock on two cores (its last arrival 10.6 s after the start, against 1 s
 * bodies), and the queue's drain read 1.52× the ideal; at real time, 1.16× (2026-11-29).
 */
const ON_REQUEST: Scenario[] = [
  { name: 'burst', description: '2,000 executions at once, limit 10, work 1 s', options: { executions: 2000, limit: 10, workSeconds: 1 }, timeScale: 1 },
  // The ceiling of a full lock by its limit (issue 15: how the sustained acquisitions per second depend on
  // the limit), beside the high limit's 500: each asks for 100 acquisitions a second (limit / work time),
  // more than DynamoDB passes on through a lock item of 50 holders or more. 600 executions, so that 400
  // or more are admitted by a hand-off or a poll; a horizon of 60 s. About 8 minutes for the three.
  ...[50, 100, 200].map(
    (limit): Scenario => ({
      name: `ceiling-${limit}`,
      description: `600 executions at once, limit ${limit}, work ${limit / 100} s: the sustained acquisitions per second once full`,
      options: { executions: 600, limit, workSeconds: limit / 100, horizonFactor: 10 },
      timeScale: 0.5,
    }),
  ),
  // The ceiling of a rate (the synth warning of a high rate, README "Rates and weights"): a rate of 100 a
  // second alone, asked by 600 executions at once with 1 s bodies, more than one lock item of 100 rate
  // permits passes on. On the bench's names (8 characters) the item is about 8.1 KB, 9 write units a write:
  // the warning's bound is 1,000 / (5 x 9) = 22 a second for the queue (each execution's two writes on its way
  // in and three to pass it a permit), 1,000 / (3 x 9) = 37 for polling (on UUID names, which it assumes, 16.7
  // and 27.8; until 2026-12-02 it counted the passage alone, 37 and 55). The sample has no rate: its column is a
  // concurrency limit of 100 around the same bodies, which asks as much. Ideal: 600 at 100 a second, 6 s.
  {
    name: 'rate-ceiling',
    description: '600 executions at once, at most 100 per second and no concurrency limit (RateLimit.perSecond(100)), work 1 s; polling every 1 s',
    options: { executions: 600, limit: 100, workSeconds: 1, workJitter: 0, rate: { count: 100, intervalSeconds: 1 }, horizonFactor: 10 },
    props: { concurrencyLimit: undefined, rateLimit: RateLimit.perSecond(100), pollInterval: Duration.seconds(1) },
    timeScale: 0.5,
  },
  // The high limit's 500 as 10 locks of 50 in one table, `lockStripes: 10`: each execution draws one at
  // random when it starts (README, "A limit in the hundreds"): 10 lock items of 50 holders, each far below
  // its partition's rate. (Until 2026-11-30 each execution's input named its lock: the same locks.) The sample
  // runs as published, one lock of 500. At a quarter of real time: at half, the DynamoDB emulator, which
  // serves one item's writes one at a time, took 2 s (simulated) for the median call (see slowCalls) and the
  // queue's drain read 2.5x to 2.75x. About 55 minutes for the three on 2026-11-30, 42 of them the sample's.
  {
    name: 'high-limit-striped',
    description: '2,000 executions at once, limit 500 split by lockStripes: 10 into locks of 50 (ours; the sample: one lock of 500), work 5 s',
    options: { executions: 2000, limit: 500, lockLimit: 50, workSeconds: 5 },
    props: { concurrencyLimit: 500, lockStripes: 10 },
    timeScale: 4,
  },
  // One queue of 10,000 (issue 15: no cap on waiters), in real time: about 5 minutes here. The queue
  // alone: 10,000 executions polling, or backing off as the sample does, would take the simulator hours
  // and show nothing the burst does not.
  {
    name: 'deep-queue',
    description: '10,000 executions at once, limit 10, work 0.2 s (the queue alone)',
    options: { executions: 10000, limit: 10, workSeconds: 0.2 },
    timeScale: 1,
    queueOnly: true,
  },
];

const SOAK: Scenario = {
  name: 'soak',
  description: '1,000 executions at limit 20, 10% failing, 5% stopped at random, 5% stopped inside, 2% throttled, duplicated events',
  options: {
    executions: 1000,
    limit: 20,
    failureRate: 0.1,
    abortRate: 0.05,
    abortInsideRate: 0.05,
    duplicateEventRate: 0.1,
    dynamoFaults: { throttleRate: 0.02 },
    horizonFactor: 3,
  },
  timeScale: 0.25,
};

/** A stack of its own with the bench's body (the work function), and the logical ID of a construct's resource in it. */
function benchStack(name: string) {
  const stack = new Stack(new App(), name);
  const body = new tasks.LambdaInvoke(stack, 'Run Work', { lambdaFunction: workFunction(stack), payloadResponseOnly: true });
  const id = (c: Construct) => stack.getLogicalId(c.node.defaultChild as CfnElement);
  return { stack, body, id, bodyStates: ['Run Work'], bodyFunctions: ['WorkFunction'] };
}

/** The AWS sample's semaphore around the same body, as the scenario runner sees it. */
export function awsSampleSubject(limit: number): Subject {
  const { stack, body, id, bodyStates, bodyFunctions } = benchStack('AwsSampleSemaphore');
  const sample = new AwsSampleSemaphore(stack, 'Sample', { body, lockName: 'demo', limit });
  return {
    name: 'AWS sample',
    stack,
    stateMachine: id(sample.stateMachine),
    table: id(sample.table),
    layout: AWS_SAMPLE_LOCK_LAYOUT,
    enterStates: ['Do Work'],
    leaveStates: ['Release Lock'],
    acquireStates: ['Acquire Lock'],
    bodyStates,
    bodyFunctions,
  };
}

/** The holder-items layout (bench/holder-items-spike.ts), polling: a design spike, run with `--spike`. */
export function holderItemsSpikeSubject(limit: number): Subject {
  const { stack, body, id, bodyStates, bodyFunctions } = benchStack('HolderItemsSpike');
  const spike = new HolderItemsSpike(stack, 'Spike', { body, lockName: 'demo', limit });
  return {
    name: 'holder items (spike, polling)',
    stack,
    stateMachine: id(spike.stateMachine),
    table: id(spike.table),
    layout: HOLDER_ITEMS_LAYOUT,
    enterStates: [SPIKE_STATES.body],
    leaveStates: [SPIKE_STATES.release, SPIKE_STATES.releaseAfterFailure],
    acquireStates: [SPIKE_STATES.acquire, SPIKE_STATES.poll],
    bodyStates,
    bodyFunctions,
  };
}

/** A queue that enqueues in one transaction and finds its next waiter by a query (bench/transact-queue-spike.ts): a design spike, run with `--spike transact-queue`. */
export function transactQueueSpikeSubject(limit: number): Subject {
  const { stack, body, id, bodyStates, bodyFunctions } = benchStack('TransactQueueSpike');
  const spike = new TransactQueueSpike(stack, 'Spike', { body, lockName: 'demo', limit });
  return {
    name: 'transactional queue (spike)',
    stack,
    stateMachine: id(spike.stateMachine),
    table: id(spike.table),
    layout: TRANSACT_QUEUE_LAYOUT,
    enterStates: [TRANSACT_QUEUE_STATES.body],
    leaveStates: [TRANSACT_QUEUE_STATES.release],
    acquireStates: [TRANSACT_QUEUE_STATES.acquire],
    bodyStates,
    bodyFunctions,
  };
}

/** The design spikes `--spike NAME` runs beside the three (bench/*-spike.ts). */
const SPIKES: Record<string, { readonly title: string; readonly subject: (limit: number) => Subject }> = {
  'holder-items': { title: 'holder items (spike, polling)', subject: holderItemsSpikeSubject },
  'transact-queue': { title: 'transactional queue (spike)', subject: transactQueueSpikeSubject },
};

interface BenchOptions {
  only?: string[];
  seed: number;
  timeScale: number;
  soak: boolean;
  /** Also run a design spike (a key of SPIKES), beside the three. */
  spike?: string;
  /** With `spike`: run the spike only, not the three. */
  spikeAlone: boolean;
  /** How long a DynamoDB transaction is under way, simulated ms (SimulatorOptions.transactionMillis): only the spikes write transactions. */
  transactionMillis: number;
  /**
   * Leave the AWS sample out: its figures depend on its definitions and the seed, not on our code, so a
   * run that measures a change of ours can take them from an earlier run of the same seed.
   */
  withoutSample: boolean;
}

function parseOptions(argv: string[]): BenchOptions {
  const options: BenchOptions = { seed: 1, timeScale: 0.05, soak: false, spikeAlone: false, transactionMillis: 0, withoutSample: false };
  for (let i = 0; i < argv.length; i++) {
    switch (argv[i]) {
      case '--only':
        options.only = argv[++i].split(',');
        break;
      case '--seed':
        options.seed = Number(argv[++i]);
        break;
      case '--time-scale':
        options.timeScale = Number(argv[++i]);
        break;
      case '--soak':
        options.soak = true;
        break;
      case '--spike-alone':
        options.spikeAlone = true;
        break;
      case '--without-sample':
        options.withoutSample = true;
        break;
      case '--transaction-millis':
        options.transactionMillis = Number(argv[++i]);
        if (!(options.transactionMillis >= 0)) throw new Error(`--transaction-millis takes a number of milliseconds, 0 or more (got ${argv[i]})`);
        break;
      case '--spike':
        // The name is optional: `--spike` alone is the first spike, the holder items.
        options.spike = argv[i + 1] !== undefined && !argv[i + 1].startsWith('--') ? argv[++i] : 'holder-items';
        if (!(options.spike in SPIKES)) throw new Error(`unknown spike ${options.spike} (one of ${Object.keys(SPIKES).join(', ')})`);
        break;
      case '--help':
        console.log(
          `Usage: npm run bench -- [--only ${[...SCENARIOS, ...ON_REQUEST].map((s) => s.name).join(',')},soak] [--seed N] [--time-scale F] [--soak] [--spike [${Object.keys(SPIKES).join('|')}] [--spike-alone]] [--transaction-millis MS] [--without-sample]`,
        );
        process.exit(0);
      default:
        throw new Error(`unknown option ${argv[i]} (try --help)`);
    }
  }
  return options;
}

type Row = [string, (r: ScenarioResult) => number, number];

/** Figures shown for each scenario: label, value, decimals. */
const ROWS: Row[] = [
  ['transitions / execution', (r) => r.transitionsPerExecution, 1],
  ['transitions beside the body / execution', (r) => r.overheadTransitionsPerExecution, 1],
  ['DynamoDB calls / execution', (r) => r.dynamoCallsPerExecution, 1],
  ['write units (WCU) / execution', (r) => r.writeUnitsPerExecution, 1],
  ['read units (RCU) / execution', (r) => r.readUnitsPerExecution, 1],
  ['largest lock item (KB)', (r) => r.largestLockItemBytes / 1024, 1],
  ['calls throttled at the partition limit', (r) => r.capacityThrottled, 0],
  ['calls refused: a transaction under way on their item', (r) => r.transactionConflicts, 0],
  ['$ per 1,000 executions', (r) => r.dollarsPer1000, 3],
  ['acquisitions / s (sustained)', (r) => r.acquisitionsPerSecond, 1],
  ['acquisitions / s once the lock was full', (r) => r.acquisitionsPerSecondOnceFull, 1],
  ['drain time / ideal', (r) => r.drainRatio, 2],
  ['last arrival: first acquire answered, simulated s after the start', (r) => r.lastArrivalSeconds, 1],
  ['DynamoDB call, median simulated ms (the emulator\'s: see slowCalls)', (r) => r.dynamoCallMillis.p50, 1],
  ['most entries into the body in any interval of the rate', (r) => r.mostAdmissionsInInterval ?? Number.NaN, 0],
  ['executions that overtook an earlier waiter', (r) => r.overtakers, 0],
  ['executions overtaken by a later one', (r) => r.overtaken, 0],
  ['wake-ups lost (injected)', (r) => r.lostWakeUps, 0],
  ['most inside at once', (r) => r.maxInside, 0],
  ['most permits held inside at once (by weight)', (r) => r.maxPermitsInside, 0],
  ['permits left held', (r) => r.permitsLeftHeld, 0],
  ['permits the reconciler reclaimed', (r) => r.reclaimedByReconciler, 0],
  ['of them, after the run stopped the executions left at its horizon', (r) => r.reclaimedAfterHorizon, 0],
  ['executions stuck waiting', (r) => r.stuck, 0],
  ['executions failed, not by their work', (r) => r.failedUnexplained, 0],
];

interface Measured {
  readonly scenario: Scenario;
  /** Undefined for a scenario that only the queue runs (and so for polling). */
  readonly sample?: ScenarioResult;
  readonly polling?: ScenarioResult;
  /** Undefined for a scenario that only polling runs. */
  readonly queue?: ScenarioResult;
  /** With `--spike`: the spike's. */
  readonly spike?: ScenarioResult;
}

/** A figure of a subject's result, or '–' for a subject that did not run the scenario. */
function cellOf([, value, decimals]: Row, r?: ScenarioResult): string {
  return r ? value(r).toFixed(decimals) : '–';
}

/** With `--spike`: the spike beside the three, a few figures each. */
function spikeTable(results: Measured[], title: string): string {
  const lines = [`| scenario | figure | AWS sample | polling | queue | ${title} |`, '|---|---|---:|---:|---:|---:|'];
  const rows = ROWS.filter(([label]) =>
    [
      'transitions beside the body / execution',
      'DynamoDB calls / execution',
      'write units (WCU) / execution',
      'largest lock item (KB)',
      'calls throttled at the partition limit',
      'calls refused: a transaction under way on their item',
      '$ per 1,000 executions',
      'acquisitions / s (sustained)',
      'acquisitions / s once the lock was full',
      'drain time / ideal',
      'executions overtaken by a later one',
      'most inside at once',
      'permits left held',
      'executions stuck waiting',
      'executions failed, not by their work',
    ].includes(label),
  );
  for (const { scenario, sample, polling, queue, spike } of results) {
    if (!spike) continue;
    for (const row of rows) {
      const [label] = row;
      const cell = (r?: ScenarioResult) => cellOf(row, r);
      lines.push(`| ${scenario.name} | ${label} | ${cell(sample)} | ${cell(polling)} | ${cell(queue)} | ${cell(spike)} |`);
    }
  }
  return lines.join('\n');
}

function table(results: Measured[]): string {
  const lines = ['| scenario | figure | AWS sample | polling | queue | queue / sample |', '|---|---|---:|---:|---:|---:|'];
  for (const { scenario, sample, polling, queue } of results) {
    for (const row of ROWS) {
      const [label, value] = row;
      const notForOne = [
        'drain time / ideal',
        'executions stuck waiting',
        'executions that overtook an earlier waiter',
        'executions overtaken by a later one',
        'acquisitions / s (sustained)',
        'acquisitions / s once the lock was full',
        'last arrival: first acquire answered, simulated s after the start',
      ];
      if (scenario.name === 'uncontended' && notForOne.includes(label)) continue;
      if (label.startsWith('wake-ups lost') && !scenario.options.lostWakeUpRate) continue;
      if (label.startsWith('most entries') && !scenario.options.rate) continue;
      if (label.startsWith('most permits') && !scenario.options.permits) continue;
      // Only the spikes write transactions.
      if (label.startsWith('calls refused: a transaction')) continue;
      // A scenario that only polling runs compares polling with the sample; one only the queue runs, nothing.
      const compared = queue ?? polling;
      let ratio = '–';
      if (sample && compared) {
        const [a, b] = [value(sample), value(compared)];
        ratio = a === 0 ? (b === 0 ? '–' : '∞') : `${(b / a).toFixed(2)}×${queue ? '' : ' (polling)'}`;
      }
      const cell = (r?: ScenarioResult) => cellOf(row, r);
      lines.push(`| ${scenario.name} | ${label} | ${cell(sample)} | ${cell(polling)} | ${cell(queue)} | ${ratio} |`);
    }
  }
  return lines.join('\n');
}

/**
 * The executions of a scenario start at once. When the last one's first acquire is answered after
 * the first bodies could have ended (a body's mean time, beyond the calls' injected latency), the
 * simulator fell behind the clock: the executions arrived over that span, and the figures are partly
 * the machine's. A queue, say, then sees releases with nobody queued yet, and later arrivals race for
 * the freed permits (a retry round each: four transitions and two calls), or bodies wait for
 * executions that are not there yet (the drain). Such a scenario needs a slower clock.
 */
export function fellBehind(scenario: Scenario, result: ScenarioResult): string | undefined {
  const allowed = (scenario.options.dynamoFaults?.maxLatencySeconds ?? 0) + (scenario.options.workSeconds ?? 15);
  if (scenario.options.executions === 1 || result.lastArrivalSeconds <= allowed) return undefined;
  // A partition over its rate spreads the first writes too (DynamoDB would): the bench cannot tell how much of the span is whose.
  const partition =
    result.capacityThrottled > 0
      ? ` (or the lock item's partition, which throttled ${result.capacityThrottled} calls, spread the first writes over that span: ` +
        'DynamoDB would, and a slower clock does not change that part)'
      : '';
  return (
    `${scenario.name} (${result.subject}): the last execution's first acquire was answered ${result.lastArrivalSeconds.toFixed(1)} s ` +
    `(simulated) after the start, after the first bodies could have ended (${allowed.toFixed(1)} s): the simulator fell behind the clock${partition} ` +
    'and the executions did not arrive at once, so these figures are partly the machine\'s. Give the scenario a slower clock (its timeScale).'
  );
}

/**
 * DynamoDB answers a call in single-digit milliseconds. The simulator's emulator serves one item's writes
 * one at a time, on the process's one thread: when thousands of executions call it faster than that, its
 * calls queue, and each step of a protocol (a hand-off is five) waits its turn. A median call slower than
 * this (simulated), ten times DynamoDB's, measures the machine, not the design. (At 50 ms the bench's
 * runs of 100 at limit 5, at 20 times real time, warned for the sample's 100 ms, whose drain its backoff
 * decides.)
 */
export const SLOW_CALL_MILLIS = 100;

/** A warning when the median DynamoDB call took longer than SLOW_CALL_MILLIS of simulated time. */
export function slowCalls(scenario: Scenario, result: ScenarioResult): string | undefined {
  const { p50, p95 } = result.dynamoCallMillis;
  if (p50 <= SLOW_CALL_MILLIS) return undefined;
  return (
    `${scenario.name} (${result.subject}): the DynamoDB emulator took ${p50.toFixed(0)} ms (simulated) for the median call and ` +
    `${p95.toFixed(0)} ms for the 95th percentile (DynamoDB: single-digit milliseconds): the machine could not serve the calls as fast ` +
    'as the clock asked, so the rates and the drain time are partly the machine\'s. Give the scenario a slower clock (its timeScale).'
  );
}

async function main(): Promise<void> {
  const options = parseOptions(process.argv.slice(2));
  if (options.spikeAlone && !options.spike) throw new Error('--spike-alone runs a spike alone: name one with --spike');
  const alone = options.spikeAlone;
  const scenarios = [...SCENARIOS, ...(options.soak ? [SOAK] : []), ...ON_REQUEST.filter((s) => options.only?.includes(s.name))].filter(
    (s) => !options.only || options.only.includes(s.name),
  );
  const results: Measured[] = [];
  for (const scenario of scenarios) {
    const timeScale = scenario.timeScale ?? options.timeScale;
    // DynamoDB's partition limits apply to every subject: a design that writes big items throttles.
    const capacity = { partitionLimits: true };
    const { transactionMillis } = options;
    const run = (subject: Subject) => runScenario(subject, { capacity, transactionMillis, ...scenario.options, seed: options.seed, timeScale });
    process.stdout.write(`${scenario.name}: ${scenario.description} (simulated time ${+(1 / timeScale).toFixed(2)}x) ...`);
    // The sample has no rate: its run is not judged by one.
    // Nor stripes: its one lock holds the whole limit.
    const sampleOptions = {
      capacity,
      transactionMillis,
      ...scenario.options,
      rate: undefined,
      permits: undefined,
      lockLimit: undefined,
      seed: options.seed,
      timeScale,
    };
    const withSample = !scenario.queueOnly && !alone && !options.withoutSample;
    const sample = withSample ? await runScenario(awsSampleSubject(scenario.options.limit), sampleOptions) : undefined;
    const ours = (waitStrategy: WaitStrategy) => demoSubject(scenario.options.limit, { ...scenario.props, waitStrategy });
    const polling = scenario.queueOnly || alone ? undefined : await run({ ...ours(WaitStrategy.POLLING), name: 'cdk-sfn-semaphore (polling)' });
    const queue = scenario.pollingOnly || alone ? undefined : await run({ ...ours(WaitStrategy.QUEUE), name: 'cdk-sfn-semaphore (queue)' });
    // The spike has no rate and no weights: only the scenarios of a plain limit.
    const spikeFits = options.spike && !scenario.options.rate && !scenario.options.permits && !scenario.options.lockLimit && !scenario.queueOnly;
    const spike = spikeFits ? await runScenario(SPIKES[options.spike!].subject(scenario.options.limit), sampleOptions) : undefined;
    const seconds = [sample, polling, queue, spike].reduce((n, r) => n + (r?.realSeconds ?? 0), 0);
    console.log(` ${seconds.toFixed(0)} s`);
    results.push({ scenario, sample, polling, queue, spike });
  }

  const date = new Date().toISOString().slice(0, 10);
  const transactions = options.transactionMillis > 0 ? `, transactions under way ${options.transactionMillis} ms` : '';
  console.log(`\nMeasured ${date}, seed ${options.seed}, simulated time ${1 / options.timeScale}x unless the scenario sets its own${transactions} (ratio: queue / sample)\n`);
  if (!alone) console.log(table(results));
  if (options.spike) console.log(`\nA design spike (bench/${options.spike}-spike.ts):\n\n${spikeTable(results, SPIKES[options.spike].title)}`);
  const behind = results.flatMap(({ scenario, sample, polling, queue, spike }) =>
    [sample, polling, queue, spike].flatMap((r) =>
      r === undefined ? [] : [fellBehind(scenario, r), slowCalls(scenario, r)].filter((w): w is string => w !== undefined),
    ),
  );
  if (behind.length > 0) console.log(`\nWarning:\n${behind.map((w) => `- ${w}`).join('\n')}`);

  const dir = path.join(__dirname, '..', 'bench-results');
  fs.mkdirSync(dir, { recursive: true });
  // One file per selection, so that a run of a few scenarios does not overwrite the day's others.
  const file = path.join(dir, `bench-${date}-seed${options.seed}${options.only ? `-${options.only.join('+')}` : ''}${options.spike ? `-${options.spike}-spike` : ''}${alone ? '-alone' : ''}${options.withoutSample ? '-without-sample' : ''}${options.transactionMillis > 0 ? `-tx${options.transactionMillis}ms` : ''}.json`);
  fs.writeFileSync(
    file,
    JSON.stringify(
      {
        date,
        seed: options.seed,
        timeScale: options.timeScale,
        transactionMillis: options.transactionMillis,
        scenarios: results.map(({ scenario, sample, polling, queue, spike }) => ({
          ...scenario,
          results: { 'aws-sample': sample, 'cdk-sfn-semaphore-polling': polling, 'cdk-sfn-semaphore-queue': queue, ...(spike ? { [`${options.spike}-spike`]: spike } : {}) },
        })),
      },
      null,
      2,
    ),
  );
  console.log(`\nFigures written to ${path.relative(process.cwd(), file)}`);
}

if (require.main === module) {
  main().catch((e) => {
    console.error(e instanceof Error ? e.stack : e);
    process.exit(2);
  });
}
