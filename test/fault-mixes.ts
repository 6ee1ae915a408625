import { ScenarioOptions } from '../simulator';
import { WaitStrategy } from '../src';

/*
 * The fault suite's run and its mixes of injected faults (test/fault-suite.test.ts), shared with the
 * suites that run them on other configurations (test/lock-stripes.test.ts: a split lock).
 */

// Under DynamoDB's capacity rules: every write billed by the item's size, and the lock item's partition
// throttled beyond 1,000 write units a second. DescribeExecution and ListExecutions are eventually
// consistent: a third of their answers are as of up to 10 s ago. (The library reads them at least
// 60 s after an entry was written, so few answers differ; reconciler-simulation.test.ts shows one that does.)
export const FAULT_SUITE_BASE: ScenarioOptions = {
  executions: 60,
  limit: 4,
  workSeconds: 10,
  timeScale: 0.02,
  capacity: { partitionLimits: true },
  staleReads: { windowSeconds: 10, rate: 0.3 },
  // A busy machine's pauses pass as simulated time: go past the horizon while executions still finish.
  extendHorizon: true,
};

export const FAULT_MIXES: Array<[string, Partial<ScenarioOptions>]> = [
  [
    'failing work, stops inside the body, duplicated and delayed events',
    { failureRate: 0.1, abortInsideRate: 0.1, duplicateEventRate: 0.3, maxEventDelaySeconds: 30 },
  ],
  ['throttling and server errors after the write', { failureRate: 0.1, dynamoFaults: { throttleRate: 0.05, serverErrorAfterWriteRate: 0.05 } }],
  ['stops at random moments: waiting, acquiring, working, releasing', { failureRate: 0.1, abortRate: 0.15, duplicateEventRate: 0.1 }],
  // Lost events can leak every permit until the reconciler's next run (5 min): a later horizon.
  ['lost events: 30% of status events never arrive', { failureRate: 0.1, abortInsideRate: 0.3, lostEventRate: 0.3, horizonFactor: 8 }],
  [
    'the late-acquire race: stops while slow DynamoDB calls are in flight',
    { abortAcquiringRate: 0.03, abortRate: 0.1, dynamoFaults: { maxLatencySeconds: 3 }, duplicateEventRate: 0.2, maxEventDelaySeconds: 10 },
  ],
  // The queue's own fault: the releaser's SendTaskSuccess is reported done but never reaches the waiter,
  // which finds its permit when its wait times out. (Polling wakes nobody: the mix is stops and failures.)
  ['lost wake-ups: 20% of SendTaskSuccess calls never arrive', { lostWakeUpRate: 0.2, failureRate: 0.1, abortRate: 0.1 }],
];

/**
 * Each mix runs once with each strategy in the test command: the queue on seed 11, polling on seed 12
 * (about 10 s a run). A stress run takes more seeds, each with both strategies:
 * `FAULT_SUITE_SEEDS=11,12,13 npx jest test/fault-suite.test.ts`.
 */
export function faultSuiteRuns(seeds: string | undefined): Array<[number, WaitStrategy]> {
  if (seeds === undefined || seeds.trim() === '') return [[11, WaitStrategy.QUEUE], [12, WaitStrategy.POLLING]];
  return seeds.split(',').flatMap((text): Array<[number, WaitStrategy]> => {
    if (!/^\d+$/.test(text.trim())) {
      throw new Error(`FAULT_SUITE_SEEDS must be whole numbers separated by commas, such as 11,12,13; '${text}' is not one (in '${seeds}')`);
    }
    const seed = Number(text);
    return [[seed, WaitStrategy.QUEUE], [seed, WaitStrategy.POLLING]];
  });
}
