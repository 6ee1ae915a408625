import { Stack } from 'aws-cdk-lib';
import { CapacityOptions, DynamoFaults } from './dynamodb';
import { seededRandom } from './random';
import { InsideTracker, LockLayout, LockMonitor, lockStates } from './semaphore';
import { Execution, Simulator, StaleReads, TaskHandler } from './simulator';
import { GRACE_MS } from '../lambda/reconciler-flows';

/*
 * One scenario of the demo, the bench and the fault suite: many executions of a semaphore-protected
 * workflow started at once, with faults injected by seed, and the figures and invariants that come
 * out. The same scenario runs our workflow and the AWS sample's, so they can be compared.
 */

/** The system under test: a synthesized stack and where to look in it. */
export interface Subject {
  readonly name: string;
  readonly stack: Stack;
  /** Logical ID (or prefix) of the protected state machine. */
  readonly stateMachine: string;
  /** Logical ID (or prefix) of the lock table. */
  readonly table: string;
  readonly layout: LockLayout;
  /** States whose entry puts an execution inside the protected section... */
  readonly enterStates: string[];
  /** ...and whose entry takes it out. */
  readonly leaveStates: string[];
  /** States that write a permit (acquire, poll). */
  readonly acquireStates: string[];
  /** States of the user's body, whose transitions are not the semaphore's overhead. */
  readonly bodyStates: string[];
  /** Logical ID prefixes of the body's Lambda functions, whose invocations are not the semaphore's cost. @default [] */
  readonly bodyFunctions?: string[];
}

/**
 * Prices, US East (N. Virginia), on-demand: what the bench's dollars are made of.
 * https://aws.amazon.com/step-functions/pricing/ https://aws.amazon.com/dynamodb/pricing/on-demand/
 * https://aws.amazon.com/lambda/pricing/
 */
export const PRICES = {
  /** Standard workflows, per state transition. */
  transition: 25 / 1e6,
  /** Per write request unit. */
  writeUnit: 0.625 / 1e6,
  /** Per read request unit. */
  readUnit: 0.125 / 1e6,
  /** A Lambda invocation of the semaphore's functions: the request, and 100 ms at 256 MB (an assumption: the simulator does not time them). */
  lambdaInvocation: 0.2 / 1e6 + 0.1 * 0.25 * 0.0000166667,
} as const;

export interface ScenarioOptions {
  readonly executions: number;
  readonly limit: number;
  /** Mean work time, simulated seconds. @default 15 */
  readonly workSeconds?: number;
  /** Work time varies by up to this fraction either way. @default 0.2 */
  readonly workJitter?: number;
  /** Probability that an execution's work fails. @default 0 */
  readonly failureRate?: number;
  /** Probability that an execution is stopped at a random moment of the run (waiting, acquiring, working...). @default 0 */
  readonly abortRate?: number;
  /** Probability that an execution is stopped while inside the protected section. @default 0 */
  readonly abortInsideRate?: number;
  /**
   * Probability, each time an acquire state starts its write, that the execution is stopped within the
   * next simulated second: while the write may still be on its way. With `dynamoFaults.maxLatencySeconds` this is
   * the late-acquire race. @default 0
   */
  readonly abortAcquiringRate?: number;
  /** Probability that a status-change event is lost. @default 0 */
  readonly lostEventRate?: number;
  /** Probability that a status-change event is delivered twice. @default 0 */
  readonly duplicateEventRate?: number;
  /** Status-change events are delayed by up to this many simulated seconds. @default 0 */
  readonly maxEventDelaySeconds?: number;
  readonly dynamoFaults?: DynamoFaults;
  /** DynamoDB's capacity rules (units are always counted). @default - counted, partition limits off */
  readonly capacity?: CapacityOptions;
  /** How long a DynamoDB transaction is under way (see SimulatorOptions.transactionMillis). @default 0 */
  readonly transactionMillis?: number;
  /** Length of task tokens. @default 700 */
  readonly taskTokenLength?: number;
  /** Probability that a wake-up (SendTaskSuccess from a task) is lost. @default 0 */
  readonly lostWakeUpRate?: number;
  /** Eventually consistent DescribeExecution and ListExecutions (see SimulatorOptions.staleReads). @default - always current */
  readonly staleReads?: StaleReads;
  /** Handlers of Task states by state name, and of Lambda functions by logical ID (see SimulatorOptions). @default - none */
  readonly taskHandlers?: Record<string, TaskHandler>;
  readonly lambdaHandlers?: Record<string, TaskHandler>;
  /** The input of execution number `id`; `id`, `workSeconds` and `fail` are added to it. @default - {} */
  readonly input?: (id: number) => Record<string, unknown>;
  /** @default 1 */
  readonly seed?: number;
  /** @default 0.02 */
  readonly timeScale?: number;
  /** Executions still running after this multiple of the ideal drain time are stuck (but see `extendHorizon`). @default 4 */
  readonly horizonFactor?: number;
  /**
   * Past the horizon, go on while executions still make progress: half an ideal drain time at a time
   * (or the stack's longest schedule period and the reconciler's grace period, if longer: a permit whose
   * status event was lost comes back only at the reconciler's next sweep), as long as in each at least
   * one execution finishes or is let into its body, up to four times the horizon. Simulated time is
   * real time scaled, so a busy machine's pauses pass as simulated seconds in which nothing can happen
   * (a machine several times slower turns each DynamoDB call into a minute of simulated time, longer
   * than a queue's check interval); a test that asserts "nobody stuck" should not fail for them. An
   * execution that waits for a permit nobody will give back is still stuck: once the others have
   * finished, nothing finishes and nobody is let in. The bench keeps the fixed horizon, so that its
   * figures mean what they say. @default false
   */
  readonly extendHorizon?: boolean;
  /** Called about every 250 ms of real time. */
  readonly onProgress?: (progress: Progress) => void;
  /**
   * A minute after the last execution stops, fire every scheduled rule once (the subject's reconciler,
   * if it has one), as its schedule would within one period, before the permits left are counted.
   * @default true
   */
  readonly sweepAfterRun?: boolean;
  /** Called at the end of the run, before executions still running are stopped as stuck: to look at them. */
  readonly atHorizon?: (sim: Simulator, running: Execution[]) => Promise<void>;
  /**
   * The subject's rate limit: at most `count` entries into the body in any `intervalSeconds`. The run
   * counts them over a sliding window (`mostAdmissionsInInterval`), and the ideal drain is the rate's
   * (or, with a `count` other than `limit`, the slower of the rate's and `limit` bodies at a time).
   * @default - no rate limit
   */
  readonly rate?: { readonly count: number; readonly intervalSeconds: number };
  /**
   * How many permits execution number `id` takes (the subject reads its weight from the input that
   * `input` gives it): the run then counts the permits of the executions inside (`maxPermitsInside`).
   * @default - one each
   */
  readonly permits?: (id: number) => number;
  /**
   * The limit of each lock item, when the executions spread over several locks whose limits add up to
   * `limit` (a lock split into stripes, each execution's `input` naming one): the lock monitor holds
   * every lock item to it, and the run every moment's executions inside to `limit`.
   * @default - `limit` (under a `rate`, its count)
   */
  readonly lockLimit?: number;
}

/** How long after the last stop the scheduled rules fire (sweepAfterRun): the reconciler's grace period, and a second. */
const SWEEP_AFTER_RUN_DELAY_SECONDS = GRACE_MS / 1000 + 1;

export interface Progress {
  readonly simulatedSeconds: number;
  readonly waiting: number;
  readonly inside: number;
  readonly done: number;
  readonly permitsInUse: number;
}

export interface ScenarioResult {
  readonly subject: string;
  readonly executions: number;
  readonly succeeded: number;
  readonly failed: number;
  readonly aborted: number;
  readonly timedOut: number;
  /** Still running at the horizon (then stopped): waiting for a permit that never came back. */
  readonly stuck: number;
  /** Failed with an error other than the work's own (for example throttling). */
  readonly failedUnexplained: number;
  /** Those failures' errors, each once with how many executions it failed and one cause (at most 200 characters). */
  readonly unexplainedErrors: string[];
  readonly maxInside: number;
  /** Permits still held once every execution stopped, or holder entries if more (an entry of no permit keeps a body slot). */
  readonly permitsLeftHeld: number;
  readonly invariantViolations: string[];
  readonly transitionsPerExecution: number;
  readonly overheadTransitionsPerExecution: number;
  /** Transitions per execution by state, beside the body's: where the overhead goes. */
  readonly overheadTransitionsByState: Readonly<Record<string, number>>;
  readonly dynamoCallsPerExecution: number;
  /** Write and read units per execution, as DynamoDB bills them: the workflow's and its cleanups' calls (not the reconciler's). */
  readonly writeUnitsPerExecution: number;
  readonly readUnitsPerExecution: number;
  /** The largest lock item sampled, bytes: every write to it is billed by its size. */
  readonly largestLockItemBytes: number;
  /** DynamoDB calls a partition over its capacity throttled (retried by the states' Retry, or failing them). */
  readonly capacityThrottled: number;
  /** DynamoDB calls refused because a transaction was under way on their item (`transactionMillis`). */
  readonly transactionConflicts: number;
  /** Invocations of the semaphore's own Lambda functions (the reconciler, the body's excluded). */
  readonly semaphoreLambdaInvocations: number;
  /**
   * Dollars per 1,000 executions for the semaphore, at PRICES: transitions beside the body and of the
   * cleanups, write and read units, and the semaphore's Lambda invocations.
   */
  readonly dollarsPer1000: number;
  readonly cleanupExecutions: number;
  readonly cleanupTransitions: number;
  readonly cleanupDynamoCalls: number;
  readonly lostEvents: number;
  readonly lostWakeUps: number;
  /** Answers of DescribeExecution and ListExecutions given stale (`staleReads`). */
  readonly staleAnswers: number;
  /**
   * Executions admitted before one that arrived earlier (its first acquire attempt answered before theirs) and
   * was still waiting: how far admission is from first come, first served.
   */
  readonly overtakers: number;
  /**
   * Executions that arrived before one admitted ahead of them: the victims of the above. One
   * execution whose first write is delayed (a throttled acquire retried after its backoff) makes
   * every later arrival an overtaker, but is itself the only one overtaken.
   */
  readonly overtaken: number;
  /** Permits the subject's reconciler reclaimed (from its metrics), during and after the run. */
  readonly reclaimedByReconciler: number;
  /**
   * Of those, the ones its run after the last execution stopped reclaimed (once every event was
   * delivered and every cleanup had run): permits that nothing but the reconciler would have freed.
   * (A scheduled run during a long simulation may free a permit whose cleanup event is still delayed;
   * that one is counted above only.)
   */
  readonly reclaimedAfterRun: number;
  /**
   * Of `reclaimedByReconciler`, the ones reclaimed once the run had stopped the executions still running at
   * its horizon (0 when none was): mostly permits of executions the run itself stopped, whose cleanups had
   * not freed them yet (at a high limit, thousands of cleanups throttled on one lock item). A leak that only
   * the sweep after the run frees (a lost status event) is counted here too; with none running at the
   * horizon, it is in `reclaimedAfterRun` only.
   */
  readonly reclaimedAfterHorizon: number;
  /** Admissions into the body per simulated second, from the first to the last. */
  readonly acquisitionsPerSecond: number;
  /**
   * Admissions per simulated second once the lock was first full (by count: `limit` executions
   * admitted): those after the `limit`-th, over the time from it to the last. The rate at which a full
   * lock passes its permits on, without the first `limit`, which needed nobody to leave. 0 when no more
   * than `limit` were admitted.
   */
  readonly acquisitionsPerSecondOnceFull: number;
  /** The most permits held at once by executions inside the body: their weights (`permits`), or one each. */
  readonly maxPermitsInside: number;
  /** With `rate`: the rate, and the most entries into the body (redriven runs' included) in any window of its interval. */
  readonly rate?: { readonly count: number; readonly intervalSeconds: number };
  readonly mostAdmissionsInInterval?: number;
  readonly drainSeconds: number;
  /**
   * Simulated seconds from the start until the last execution's first acquire was answered. The
   * executions start at once, so this is near 0 unless the calls land late (injected latency) or the
   * machine cannot keep up with the clock: then they arrive over this span instead, and the figures
   * measure the machine as well (run at a slower `timeScale`).
   */
  readonly lastArrivalSeconds: number;
  /**
   * The median and the 95th percentile of the DynamoDB emulator's time per call (admitted item calls,
   * not transactions; injected latency left out), in simulated milliseconds. DynamoDB answers in single-digit milliseconds; when
   * these grow, the machine could not serve the calls as fast as the clock asked, every step of a
   * protocol took that long, and the rates and drain times measure the machine too (run at a slower
   * `timeScale`).
   */
  readonly dynamoCallMillis: { readonly p50: number; readonly p95: number };
  readonly idealSeconds: number;
  readonly drainRatio: number;
  readonly realSeconds: number;
}

function transitionsByState(executions: Execution[], bodyStates: readonly string[]): Record<string, number> {
  const total = new Map<string, number>();
  for (const e of executions) {
    for (const [name, count] of e.stateTransitions) {
      if (!bodyStates.includes(name)) total.set(name, (total.get(name) ?? 0) + count);
    }
  }
  return Object.fromEntries([...total].sort(([, a], [, b]) => b - a).map(([name, count]) => [name, count / Math.max(1, executions.length)]));
}

/** Run one scenario against one subject. */
export async function runScenario(subject: Subject, options: ScenarioOptions): Promise<ScenarioResult> {
  const seed = options.seed ?? 1;
  const random = seededRandom(seed * 7919 + 17);
  const workSeconds = options.workSeconds ?? 15;
  const jitter = options.workJitter ?? 0.2;
  // `limit` bodies at a time, and under a rate at most `count` starts per interval (each permit of the
  // rate passes on at most once per interval); with weights, the permits all take.
  const weights = Array.from({ length: options.executions }, (_, id) => options.permits?.(id) ?? 1);
  const permitsTaken = weights.reduce((a, b) => a + b, 0);
  const rate = options.rate;
  const idealSeconds = Math.max(
    Math.ceil(permitsTaken / options.limit) * workSeconds,
    rate === undefined ? 0 : Math.ceil(permitsTaken / rate.count) * rate.intervalSeconds,
  );
  const realStart = Date.now();

  const sim = await Simulator.start(subject.stack, {
    seed,
    timeScale: options.timeScale ?? 0.02,
    dynamoFaults: options.dynamoFaults,
    capacity: options.capacity,
    transactionMillis: options.transactionMillis,
    taskTokenLength: options.taskTokenLength,
    lostWakeUpRate: options.lostWakeUpRate,
    staleReads: options.staleReads,
    taskHandlers: options.taskHandlers,
    lambdaHandlers: options.lambdaHandlers,
    eventFaults: {
      lossRate: options.lostEventRate,
      duplicateRate: options.duplicateEventRate,
      maxDelaySeconds: options.maxEventDelaySeconds,
    },
  });
  try {
    const sm = sim.stateMachine(subject.stateMachine);
    const weightByArn = new Map<string, number>();
    const tracker = new InsideTracker(sim, subject.enterStates, subject.leaveStates, (e) => weightByArn.get(e.arn) ?? 1);
    // Under a rate the lock's permits are its count, whatever the limit (a lower one is the bodies' slots).
    const monitor = new LockMonitor(sim, subject.table, () => options.lockLimit ?? options.rate?.count ?? options.limit, subject.layout).start(25);

    // Decide every execution's fate up front, so that both subjects get the same ones.
    const plans = Array.from({ length: options.executions }, (_, id) => ({
      input: {
        ...options.input?.(id),
        id,
        workSeconds: workSeconds * (1 + jitter * (2 * random() - 1)),
        fail: random() < (options.failureRate ?? 0),
      },
      abortAfter: random() < (options.abortRate ?? 0) ? random() * idealSeconds : undefined,
      abortInside: random() < (options.abortInsideRate ?? 0),
      abortInsideAfter: random(),
    }));
    const abortInside = new Map<string, number>();
    // Arrival (the answer to the first acquire attempt: from then on the lock knows it waits, and
    // executions started together reach DynamoDB in some order) and admission (entry into the body),
    // for the FIFO figure.
    const arrived = new Map<string, number>();
    const admitted = new Map<string, number>();
    sim.onTaskEnded((execution, stateName) => {
      if (subject.acquireStates.includes(stateName) && !arrived.has(execution.arn)) arrived.set(execution.arn, sim.now());
    });
    /** Every entry into the body, for the rate. */
    const entries: number[] = [];
    sim.onStateEntered((execution, stateName, enteredAt) => {
      if (!subject.enterStates.includes(stateName)) return;
      entries.push(enteredAt);
      if (!admitted.has(execution.arn)) admitted.set(execution.arn, enteredAt);
    });
    const acquireRandom = seededRandom(seed * 104729 + 3);
    sim.onTaskStarted((execution, stateName) => {
      if (subject.acquireStates.includes(stateName) && acquireRandom() < (options.abortAcquiringRate ?? 0)) {
        void sim.sleep(acquireRandom(), execution.stopped.signal).then(() => execution.abort('Demo.Stopped', 'stopped while acquiring'));
      }
    });
    sim.onStateEntered((execution, stateName) => {
      const fraction = abortInside.get(execution.arn);
      if (fraction !== undefined && subject.enterStates.includes(stateName)) {
        abortInside.delete(execution.arn);
        void sim.sleep(fraction * workSeconds, execution.stopped.signal).then(() => execution.abort('Demo.Stopped', 'stopped inside the body'));
      }
    });

    const executions: Execution[] = plans.map((plan, id) => {
      const e = sim.startExecution(sm, plan.input, { abortAfterSeconds: plan.abortAfter });
      weightByArn.set(e.arn, weights[id]);
      if (plan.abortInside) abortInside.set(e.arn, plan.abortInsideAfter);
      return e;
    });
    const simStart = sim.now();

    const progress = setInterval(() => {
      const done = executions.filter((e) => e.status !== 'RUNNING').length;
      options.onProgress?.({
        simulatedSeconds: (sim.now() - simStart) / 1000,
        waiting: executions.length - done - tracker.inside,
        inside: tracker.inside,
        done,
        permitsInUse: monitor.permitsInUse,
      });
    }, 250);

    // Run until every execution has stopped, or the horizon; past it, while executions still finish.
    const horizonSeconds = idealSeconds * (options.horizonFactor ?? 4);
    const allDone = Promise.all(executions.map((e) => e.done));
    // The horizon's timers end with the run: armed, they would keep the process open until they fired.
    const horizon = new AbortController();
    await Promise.race([allDone, sim.sleep(horizonSeconds, horizon.signal)]);
    // Progress: an execution finished, or one was let in (a waiter's admission shows before its body ends).
    const progressMade = () => executions.filter((e) => e.status !== 'RUNNING').length + admitted.size;
    const stopped = () => executions.filter((e) => e.status !== 'RUNNING').length;
    const limit = options.extendHorizon ? 3 * horizonSeconds : 0;
    // Half an ideal drain, or long enough for a schedule's next run: a permit leaked with its status event
    // comes back only when the reconciler next sweeps (one period away at most, and past its grace period),
    // and the executions waiting for it make no progress until then.
    const schedule = sim.longestSchedulePeriodSeconds;
    const step = Math.max(idealSeconds / 2, schedule > 0 ? schedule + SWEEP_AFTER_RUN_DELAY_SECONDS : 0);
    for (let extended = 0, before = progressMade(); stopped() < executions.length && extended < limit; extended += step) {
      await Promise.race([allDone, sim.sleep(step, horizon.signal)]);
      if (progressMade() === before) break;
      before = progressMade();
    }
    horizon.abort();
    const reclaimedBeforeHorizon = emittedMetricSum(sim, 'PermitsReclaimed');
    const running = executions.filter((e) => e.status === 'RUNNING');
    const unexplained = executions.filter((e) => e.status === 'FAILED' && e.error !== 'WorkFailed');
    const lastStop = Math.max(simStart, ...executions.filter((e) => e.stopDate !== undefined).map((e) => e.stopDate!));
    await options.atHorizon?.(sim, running);
    for (const e of running) e.abort('Demo.Stuck', 'still waiting at the horizon');
    await sim.idle();
    clearInterval(progress);
    const reclaimedDuringRun = emittedMetricSum(sim, 'PermitsReclaimed');
    if (options.sweepAfterRun ?? true) {
      // A schedule fires within one period of the last stop; at least the sweep's grace period passes
      // first, or it would leave the entries of the last executions alone (lambda/reconciler-flows.ts).
      await sim.sleep(SWEEP_AFTER_RUN_DELAY_SECONDS);
      await sim.fireScheduledRules();
      await sim.idle();
    }
    await monitor.stop();

    const locks = await lockStates(sim, subject.table, subject.layout);
    const protectedRuns = executions;
    const cleanups = [...sim.executions.values()].filter((e) => e.stateMachine !== sm);
    const mean = (f: (e: Execution) => number) => protectedRuns.reduce((n, e) => n + f(e), 0) / protectedRuns.length;
    const drainSeconds = (lastStop - simStart) / 1000;
    const overheadByState = transitionsByState(protectedRuns, subject.bodyStates);
    const overhead = Object.values(overheadByState).reduce((n, c) => n + c, 0);
    /** A figure of the workflow's executions and their cleanups, per workflow execution. */
    const perExecution = (f: (e: Execution) => number) => [...protectedRuns, ...cleanups].reduce((n, e) => n + f(e), 0) / protectedRuns.length;
    const semaphoreInvocations = [...sim.lambdaInvocations]
      .filter(([id]) => !(subject.bodyFunctions ?? []).some((prefix) => id.startsWith(prefix)))
      .reduce((n, [, count]) => n + count, 0);
    return {
      subject: subject.name,
      executions: executions.length,
      succeeded: executions.filter((e) => e.status === 'SUCCEEDED').length,
      failed: executions.filter((e) => e.status === 'FAILED').length,
      aborted: executions.filter((e) => e.status === 'ABORTED' && e.error !== 'Demo.Stuck').length,
      timedOut: executions.filter((e) => e.status === 'TIMED_OUT').length,
      stuck: running.length,
      failedUnexplained: unexplained.length,
      unexplainedErrors: [...new Set(unexplained.map((e) => e.error))].map((error) => {
        const failed = unexplained.filter((e) => e.error === error);
        return `${failed.length} × ${error ?? '(no error)'}: ${(failed[0].cause ?? '').slice(0, 200)}`;
      }),
      maxInside: tracker.maxInside,
      maxPermitsInside: tracker.maxPermitsInside,
      permitsLeftHeld: locks.reduce((n, l) => n + Math.max(l.permitsInUse, l.holders.length), 0),
      invariantViolations: [...new Set(monitor.violations)],
      transitionsPerExecution: mean((e) => e.transitions),
      overheadTransitionsPerExecution: overhead,
      overheadTransitionsByState: overheadByState,
      dynamoCallsPerExecution: mean((e) => e.dynamoCalls),
      writeUnitsPerExecution: perExecution((e) => e.writeUnits),
      readUnitsPerExecution: perExecution((e) => e.readUnits),
      largestLockItemBytes: monitor.maxItemBytes,
      capacityThrottled: sim.dynamo.capacityThrottled,
      transactionConflicts: sim.dynamo.conflicts,
      semaphoreLambdaInvocations: semaphoreInvocations,
      dollarsPer1000:
        1000 *
        (PRICES.transition * (overhead + cleanups.reduce((n, e) => n + e.transitions, 0) / protectedRuns.length) +
          PRICES.writeUnit * perExecution((e) => e.writeUnits) +
          PRICES.readUnit * perExecution((e) => e.readUnits) +
          (PRICES.lambdaInvocation * semaphoreInvocations) / protectedRuns.length),
      cleanupExecutions: cleanups.length,
      cleanupTransitions: cleanups.reduce((n, e) => n + e.transitions, 0),
      cleanupDynamoCalls: cleanups.reduce((n, e) => n + e.dynamoCalls, 0),
      lostEvents: sim.lostEvents,
      lostWakeUps: sim.lostWakeUps,
      staleAnswers: sim.staleAnswers,
      overtakers: countOvertakers(arrived, admitted),
      overtaken: countOvertaken(arrived, admitted),
      reclaimedByReconciler: emittedMetricSum(sim, 'PermitsReclaimed'),
      reclaimedAfterRun: emittedMetricSum(sim, 'PermitsReclaimed') - reclaimedDuringRun,
      reclaimedAfterHorizon: running.length === 0 ? 0 : emittedMetricSum(sim, 'PermitsReclaimed') - reclaimedBeforeHorizon,
      acquisitionsPerSecond: admissionRate(admitted),
      acquisitionsPerSecondOnceFull: admissionRateOnceFull(admitted, options.limit),
      ...(options.rate ? { rate: options.rate, mostAdmissionsInInterval: mostInAnyWindow(entries, options.rate.intervalSeconds * 1000) } : {}),
      drainSeconds,
      lastArrivalSeconds: arrived.size === 0 ? 0 : (Math.max(...arrived.values()) - simStart) / 1000,
      dynamoCallMillis: { p50: percentile(sim.dynamo.callMillis, 0.5), p95: percentile(sim.dynamo.callMillis, 0.95) },
      idealSeconds,
      drainRatio: drainSeconds / idealSeconds,
      realSeconds: (Date.now() - realStart) / 1000,
    };
  } finally {
    await sim.stop();
  }
}

/** The most of `times` (ms) inside any half-open window of `windowMs`, wherever it starts: a sliding window. */
export function mostInAnyWindow(times: number[], windowMs: number): number {
  const sorted = [...times].sort((a, b) => a - b);
  let most = 0;
  let first = 0;
  for (let last = 0; last < sorted.length; last++) {
    while (sorted[last] - sorted[first] >= windowMs) first++;
    most = Math.max(most, last - first + 1);
  }
  return most;
}

/** The value at fraction `q` (0 to 1) of `values` sorted, nearest rank; 0 for none. */
export function percentile(values: readonly number[], q: number): number {
  if (values.length === 0) return 0;
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil(q * sorted.length) - 1))];
}

/** Admissions per second from the first to the last (0 with fewer than two): those after the first, as a lock of limit 1 counts them. */
export function admissionRate(admitted: Map<string, number>): number {
  return admissionRateOnceFull(admitted, 1);
}

/**
 * Admissions per second after the `limit`-th (by time), over the span from it to the last: what a full
 * lock sustains. 0 when no more than `limit` were admitted, or all at one instant.
 */
export function admissionRateOnceFull(admitted: Map<string, number>, limit: number): number {
  const times = [...admitted.values()].sort((a, b) => a - b);
  if (times.length <= limit) return 0;
  const span = (times[times.length - 1] - times[limit - 1]) / 1000;
  return span > 0 ? (times.length - limit) / span : 0;
}

/** Executions admitted before an execution that arrived earlier and was admitted later. */
export function countOvertakers(arrived: Map<string, number>, admitted: Map<string, number>): number {
  const runs = [...admitted].map(([arn, at]) => ({ arrival: arrived.get(arn) ?? at, admission: at }));
  return runs.filter((e) => runs.some((w) => w.arrival < e.arrival && w.admission > e.admission)).length;
}

/** Executions admitted after an execution that arrived later and was admitted earlier. */
export function countOvertaken(arrived: Map<string, number>, admitted: Map<string, number>): number {
  const runs = [...admitted].map(([arn, at]) => ({ arrival: arrived.get(arn) ?? at, admission: at }));
  return runs.filter((w) => runs.some((e) => w.arrival < e.arrival && w.admission > e.admission)).length;
}

/** The sum of one metric over every embedded-metric-format record the stack's Lambda functions logged. */
export function emittedMetricSum(sim: Simulator, metric: string): number {
  let sum = 0;
  for (const lines of sim.lambdaLogs.values()) {
    for (const line of lines) {
      if (!line.startsWith('{') || !line.includes('"_aws"')) continue;
      const value = (JSON.parse(line) as Record<string, unknown>)[metric];
      if (typeof value === 'number') sum += value;
    }
  }
  return sum;
}

/**
 * The invariants every scenario must keep, as sentences; an empty list means all held: never more
 * than the limit inside, no permit left held, nobody stuck waiting, every failure explained by the
 * work, under a rate never more entries into the body in any interval than the rate, and the lock
 * item's count equal to its holders at every sample.
 */
export function brokenInvariants(result: ScenarioResult, limit: number): string[] {
  const broken: string[] = [];
  if (result.maxPermitsInside > limit) {
    broken.push(
      result.maxPermitsInside === result.maxInside
        ? `${result.maxInside} executions were inside at once, limit ${limit}`
        : `executions inside held ${result.maxPermitsInside} permits at once, limit ${limit}`,
    );
  }
  if (result.permitsLeftHeld > 0) broken.push(`${result.permitsLeftHeld} permits are still held after every execution stopped`);
  if (result.stuck > 0) broken.push(`${result.stuck} executions were still waiting at the horizon`);
  if (result.failedUnexplained > 0) {
    broken.push(`${result.failedUnexplained} executions failed with an error other than their work's (${result.unexplainedErrors.join('; ')})`);
  }
  if (result.rate && result.mostAdmissionsInInterval! > result.rate.count) {
    broken.push(`${result.mostAdmissionsInInterval} executions entered the body within ${result.rate.intervalSeconds} s, rate ${result.rate.count}`);
  }
  broken.push(...result.invariantViolations.slice(0, 5));
  return broken;
}
