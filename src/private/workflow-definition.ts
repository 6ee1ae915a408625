import { Duration } from 'aws-cdk-lib';
import * as sfn from 'aws-cdk-lib/aws-stepfunctions';
import * as tasks from 'aws-cdk-lib/aws-stepfunctions-tasks';
import { Construct } from 'constructs';
import { CONDITIONAL_CHECK_FAILED, SERVER_ERRORS, THROTTLING_ERRORS, transientRetry, VALIDATION_ERROR } from './dynamodb-errors';
import {
  ERROR_PATH as IDEMPOTENT_ERROR_PATH,
  IdempotencyStates,
  INPUT_PATH as IDEMPOTENT_INPUT_PATH,
  OUTPUT_PATH as IDEMPOTENT_OUTPUT_PATH,
} from './idempotency-states';
import { acquireTask, LockTaskProps } from './lock-tasks';
import {
  ENQUEUE_REFUSED,
  ENQUEUE_UNCERTAIN,
  WAIT_TIMED_OUT,
  fencingTokenTask,
  HANDOFF_PATH,
  handOffChain,
  renewWaitTask,
  waitInQueueTask,
} from './queue-states';
import { pathFromExecutionInput, RuntimeValue } from './runtime-value';
import { STATE } from './state-names';
import { ISemaphoreTable } from '../semaphore-table';
import { WaitStrategy } from '../wait-strategy';

/*
 * The workflow's definition: acquire, the body in a Parallel, the release and its hand-off, and the
 * wait (in the queue, or polling), rendered from the validated props of ConcurrencyControlledWorkflow.
 */

/**
 * The definition:
 *
 *   Acquire Permit ──ok──▶ Run Protected Body ──ok──▶ Release Permit (hands off to a waiter if any)
 *     │ lock full                │ error                  (body output is the execution output)
 *     ▼                          ▼
 *   Wait In Queue ──▶ …        Prepare Release After Failure ──▶ Release Permit After Failure ──▶ Fail
 *   (or Wait For Permit: polling)
 *
 * The uncontended path is three transitions and two writes. A waiter adds one transition and one
 * write (the enqueue); a release that hands off adds three transitions, two writes and a call.
 */
export function renderDefinition(scope: Construct, table: ISemaphoreTable, spec: DefinitionSpec): sfn.IChainable {
  const lockName = tasks.DynamoAttributeValue.fromString(
    spec.lockName.inputPath === undefined ? spec.lockName.fixed! : sfn.JsonPath.stringAt(pathFromExecutionInput(spec.lockName.inputPath)),
  );
  const lockTask: LockTaskProps = { table: table, lockName, holder: sfn.JsonPath.stringAt('$$.Execution.Id') };
  const limit =
    spec.limit.inputPath === undefined
      ? tasks.DynamoAttributeValue.fromNumber(spec.limit.fixed!)
      : tasks.DynamoAttributeValue.numberFromString(
        sfn.JsonPath.format('{}', sfn.JsonPath.stringAt(pathFromExecutionInput(spec.limit.inputPath))),
      );
  // With idempotency, the state data is the key function's result: the input at `$.payload`, which
  // the body's output replaces, an error at `$.error`; the record is completed after the release.
  const idem = spec.idempotency;
  const errorPath = idem ? IDEMPOTENT_ERROR_PATH : '$';
  // Where the body finds `{ fencingToken }`, in the state data before the body.
  const permitPath = spec.permitPath && (idem ? `${IDEMPOTENT_INPUT_PATH}${spec.permitPath.slice(1)}` : spec.permitPath);
  // The release reads its holder and run from the state data, so that it can also give back the
  // permit of a waiter it could not wake.
  const holderOfThisRun = {
    holder: sfn.JsonPath.stringAt('$$.Execution.Id'),
    redriveCount: sfn.JsonPath.numberAt('$$.Execution.RedriveCount'),
  };

  // Failure path: give the permit back if we hold it, then fail with the error that brought us here.
  const failWithError = idem ? idem.markFailed : new sfn.Fail(scope, STATE.failWithError, { errorPath: '$.Error', causePath: '$.Cause' });
  const releaseAfterFailure = new sfn.Pass(scope, STATE.prepareReleaseAfterFailure, { parameters: holderOfThisRun, resultPath: HANDOFF_PATH });
  releaseAfterFailure.next(handOffChain(scope, { table: table, lockName, suffix: ' After Failure', next: failWithError }));

  // Success path. The Parallel wraps the body's output in an array: `$[0]` unwraps it.
  let runBody: sfn.Parallel;
  if (idem) {
    runBody = new sfn.Parallel(scope, STATE.runBody, { inputPath: IDEMPOTENT_INPUT_PATH, resultPath: IDEMPOTENT_OUTPUT_PATH });
    runBody.next(
      new sfn.Pass(scope, STATE.prepareRelease, { parameters: holderOfThisRun, resultPath: HANDOFF_PATH }).next(
        handOffChain(scope, { table: table, lockName, suffix: '', next: idem.saveResult, alreadyReleased: idem.saveResult }),
      ),
    );
  } else {
    // The output and the release's holder in one object, without a state of its own.
    runBody = new sfn.Parallel(scope, STATE.runBody, {
      resultSelector: { output: sfn.JsonPath.objectAt('$[0]'), handoff: holderOfThisRun },
    });
    runBody.next(handOffChain(scope, { table: table, lockName, suffix: '', outputPath: '$.output' }));
  }
  runBody
    .branch(spec.body)
    // resultPath '$': the failure path needs only the error, and the lock name comes from the context.
    .addCatch(releaseAfterFailure, { errors: [sfn.Errors.ALL], resultPath: errorPath });

  // A permit taken inside a Parallel (whose result is discarded) reads its fencing token after it.
  // (Only where a Parallel takes the permit: polling, or the queue with an acquire timeout.)
  let toBody: sfn.State = runBody;
  if (permitPath && (spec.waitStrategy === WaitStrategy.POLLING || spec.acquireTimeout !== undefined)) {
    toBody = fencingTokenTask(scope, STATE.readFencingToken, { table: table, lockName, permitPath }).addCatch(releaseAfterFailure, {
      errors: [sfn.Errors.ALL],
      resultPath: errorPath,
    });
    (toBody as sfn.TaskStateBase).next(runBody);
  }

  let waitForPermit: sfn.State;
  if (spec.waitStrategy === WaitStrategy.QUEUE) {
    waitForPermit = renderQueueWait(scope, table, spec, lockTask, limit, runBody, toBody, releaseAfterFailure, errorPath, permitPath);
  } else {
    const polling = renderWaitForPermit(scope, table, spec, lockTask, limit, toBody);
    polling.addCatch(releaseAfterFailure, { errors: [sfn.Errors.ALL], resultPath: errorPath });
    polling.next(toBody);
    waitForPermit = polling;
  }

  // The acquire found this execution's own entry (see ACQUIRE_CONDITION): a permit it holds already,
  // taken by a write of its stopped run that landed late, or by a write whose response was lost.
  // It claims that permit for its current run; if it was freed meanwhile, it waits for one.
  const claimOwn = fencingTokenTask(scope, STATE.claimOwnPermit, { table: table, lockName, permitPath })
    .addCatch(waitForPermit, { errors: [CONDITIONAL_CHECK_FAILED], resultPath: sfn.JsonPath.DISCARD })
    .addCatch(releaseAfterFailure, { errors: [sfn.Errors.ALL], resultPath: errorPath })
    .next(runBody);

  // A server error leaves it open whether the write landed: try again. If it did land, the retry
  // finds the execution's own entry, and the execution claims it.
  const acquire = acquireTask(scope, STATE.acquire, { ...lockTask, limit, leaseSeconds: spec.leaseSeconds, permitPath })
    .addRetry(transientRetry([...THROTTLING_ERRORS, ...SERVER_ERRORS]))
    .addCatch(waitForPermit, { errors: [CONDITIONAL_CHECK_FAILED], resultPath: sfn.JsonPath.DISCARD })
    .addCatch(claimOwn, { errors: [VALIDATION_ERROR], resultPath: sfn.JsonPath.DISCARD })
    .next(runBody);
  const start = (head: sfn.IChainable) => (idem ? idem.start(head) : head);
  if (spec.limit.inputPath === undefined) {
    return start(acquire);
  }

  // A limit read from the input is checked before the first acquire: on a lock nobody holds yet the
  // condition `attribute_not_exists(permits)` would let one execution in whatever the limit, and a
  // limit below 1 would make every other execution wait forever. One more transition, only here.
  const invalidLimit = new sfn.Fail(scope, STATE.runtimeLimitInvalid, {
    error: INVALID_LIMIT_ERROR,
    cause: `The concurrency limit read from the execution input at ${spec.limit.inputPath} must be a number of at least 1`,
  });
  // With idempotency too, the check comes first: an invalid input never claims a record.
  return new sfn.Choice(scope, STATE.checkRuntimeLimit)
    .when(sfn.Condition.not(sfn.Condition.isPresent(spec.limit.inputPath)), invalidLimit)
    .when(sfn.Condition.not(sfn.Condition.isNumeric(spec.limit.inputPath)), invalidLimit)
    .when(sfn.Condition.numberLessThan(spec.limit.inputPath, 1), invalidLimit)
    .otherwise(start(acquire));
}

/**
 * The queue: "Wait In Queue" enqueues and sleeps until woken with the permit. When its wait times out
 * it sleeps again in its place, with a write that is refused if the wake-up was lost (a permit was
 * handed to it), a permit is free or its place is gone. When the queue refuses (a permit came free,
 * or the queue is full), the execution checks for a handed-off permit and tries once to take one:
 *
 *   Wait In Queue ─woken─▶ body; timed out ─▶ Wait In Queue Again
 *     │ refused
 *     ▼
 *   Check Handed-Off Permit ─yes─▶ body
 *     │ no
 *     ▼
 *   Poll For Permit ─yes─▶ body
 *     │ full
 *     ▼
 *   Wait In Queue Again (its place kept, a new token) ─woken─▶ body; timed out ─▶ itself
 *     │ refused: handed a permit (a lost wake-up), a permit free, or no place any more
 *     ▼
 *   Check Handed-Off Permit Again ─yes─▶ body
 *     │ no
 *     ▼
 *   Wait Before Next Poll ─▶ Wait In Queue
 *
 * With an `acquireTimeout`, these states run in the "Wait For Permit" Parallel beside a timer, as
 * the polling states do.
 */
function renderQueueWait(
  scope: Construct,
  table: ISemaphoreTable,
  spec: DefinitionSpec,
  lockTask: LockTaskProps,
  limit: tasks.DynamoAttributeValue,
  runBody: sfn.State,
  toBody: sfn.State,
  releaseAfterFailure: sfn.State,
  errorPath: string,
  permitPath: string | undefined,
): sfn.State {
  const inParallel = spec.acquireTimeout !== undefined;
  // In the Parallel, success ends the branch with the marker error; the fencing token is read after it.
  const acquired: sfn.State = inParallel
    ? new sfn.Fail(scope, STATE.permitAcquired, { error: PERMIT_ACQUIRED, cause: 'Not an error: ends the Parallel early so that the body can start' })
    : runBody;
  const ownPermitPath = inParallel ? undefined : permitPath;
  const onError = <T extends sfn.TaskStateBase>(task: T): T =>
    (inParallel ? task : task.addCatch(releaseAfterFailure, { errors: [sfn.Errors.ALL], resultPath: errorPath })) as T;

  const waiter = {
    table: table,
    lockName: lockTask.lockName,
    limit,
    leaseSeconds: spec.leaseSeconds ?? 0,
    checkInterval: spec.queueCheckInterval,
    permitPath: ownPermitPath,
  };
  const waitInQueue = waitInQueueTask(scope, waiter);
  const waitAgain = renewWaitTask(scope, waiter);
  const nextWait = new sfn.Wait(scope, STATE.nextWait, { time: sfn.WaitTime.duration(spec.pollInterval) }).next(waitInQueue);
  const checkProps = { table: table, lockName: lockTask.lockName, permitPath: ownPermitPath };
  // Found the execution's own entry (handed to it meanwhile, or taken by a write of an earlier run):
  // claim it; if it went meanwhile, queue anew after a pause.
  const checkAgain = fencingTokenTask(scope, STATE.checkHandedOffAgain, checkProps)
    .addCatch(nextWait, { errors: [CONDITIONAL_CHECK_FAILED], resultPath: sfn.JsonPath.DISCARD });
  onError(checkAgain).next(acquired);
  // Server errors are retried: a write that landed makes the retry find the execution's own entry.
  const poll = acquireTask(scope, STATE.poll, { ...lockTask, limit, leaseSeconds: spec.leaseSeconds, permitPath: ownPermitPath, asWaiter: true })
    .addRetry(transientRetry([...THROTTLING_ERRORS, ...SERVER_ERRORS]))
    .addCatch(waitAgain, { errors: [CONDITIONAL_CHECK_FAILED], resultPath: sfn.JsonPath.DISCARD })
    .addCatch(checkAgain, { errors: [VALIDATION_ERROR], resultPath: sfn.JsonPath.DISCARD });
  onError(poll).next(acquired);
  const check = fencingTokenTask(scope, STATE.checkHandedOff, checkProps)
    .addCatch(poll, { errors: [CONDITIONAL_CHECK_FAILED], resultPath: sfn.JsonPath.DISCARD });
  onError(check).next(acquired);
  // Timed out (no wake-up within the check interval): sleep again in place, a write whose condition
  // is the whole check (no permit handed over, none free, the entry still there).
  waitInQueue.addCatch(waitAgain, { errors: WAIT_TIMED_OUT, resultPath: sfn.JsonPath.DISCARD });
  // Refused: the lock has a free permit, the queue is full, or this execution already holds a
  // permit (handed over while it was not waiting: after a lost wake-up, or to an older entry of it).
  waitInQueue.addCatch(check, { errors: [...ENQUEUE_REFUSED, ...ENQUEUE_UNCERTAIN], resultPath: sfn.JsonPath.DISCARD });
  onError(waitInQueue).next(acquired);
  // Refused: a permit was handed to it (its wake-up was lost), or its entry is gone (dropped, or
  // served and taken back), or a permit is free. Check for a handed-off permit, then queue anew after
  // a pause that keeps a full queue from becoming a busy loop (the enqueue takes a free permit's
  // refusal to the poll).
  waitAgain.addCatch(waitAgain, { errors: WAIT_TIMED_OUT, resultPath: sfn.JsonPath.DISCARD });
  waitAgain.addCatch(checkAgain, { errors: ENQUEUE_REFUSED, resultPath: sfn.JsonPath.DISCARD });
  waitAgain.addCatch(check, { errors: ENQUEUE_UNCERTAIN, resultPath: sfn.JsonPath.DISCARD });
  onError(waitAgain).next(acquired);

  if (!inParallel) {
    return waitInQueue;
  }
  const timer = new sfn.Wait(scope, STATE.acquireTimer, { time: sfn.WaitTime.duration(spec.acquireTimeout!) }).next(
    new sfn.Fail(scope, STATE.acquireTimedOut, {
      error: ACQUIRE_TIMEOUT_ERROR,
      cause: `No permit became free within the acquire timeout of ${spec.acquireTimeout!.toHumanString()}`,
    }),
  );
  return new sfn.Parallel(scope, STATE.waitForPermit, { resultPath: sfn.JsonPath.DISCARD })
    .branch(waitInQueue, timer)
    .addCatch(toBody, { errors: [PERMIT_ACQUIRED], resultPath: sfn.JsonPath.DISCARD })
    .addCatch(releaseAfterFailure, { errors: [sfn.Errors.ALL], resultPath: errorPath });
}

/**
 * The polling wait, a Parallel whose result is discarded:
 *
 *   Draw Poll Delay → Wait Before First Poll → Poll For Permit ⇄ Wait Before Next Poll
 *
 * With an `acquireTimeout`, a second branch waits that long and fails with `SemaphoreAcquireTimeout`;
 * a Parallel ends early only when a branch fails, so the polling branch then ends with the marker
 * error `SemaphorePermitAcquired`, which the Parallel's first catch turns into "go to the body".
 */
function renderWaitForPermit(
  scope: Construct,
  table: ISemaphoreTable,
  spec: DefinitionSpec,
  lockTask: LockTaskProps,
  limit: tasks.DynamoAttributeValue,
  toBody: sfn.State,
): sfn.Parallel {
  const waitForPermit = new sfn.Parallel(scope, STATE.waitForPermit, { resultPath: sfn.JsonPath.DISCARD });

  const nextWait = new sfn.Wait(scope, STATE.nextWait, { time: sfn.WaitTime.duration(spec.pollInterval) });
  // A poll refused on the execution's own entry (a permit its stopped run took, or a write whose
  // response was lost) claims it, rather than poll beside it until the execution times out.
  const claimOwn = fencingTokenTask(scope, STATE.claimOwnPermitWhilePolling, { table: table, lockName: lockTask.lockName })
    .addCatch(nextWait, { errors: [CONDITIONAL_CHECK_FAILED], resultPath: sfn.JsonPath.DISCARD });
  // Server errors are retried: a write that landed makes the retry find the execution's own entry.
  const poll = acquireTask(scope, STATE.poll, { ...lockTask, limit, leaseSeconds: spec.leaseSeconds })
    .addRetry(transientRetry([...THROTTLING_ERRORS, ...SERVER_ERRORS]))
    .addCatch(nextWait, { errors: [CONDITIONAL_CHECK_FAILED], resultPath: sfn.JsonPath.DISCARD })
    .addCatch(claimOwn, { errors: [VALIDATION_ERROR], resultPath: sfn.JsonPath.DISCARD });
  nextWait.next(poll);

  // Full jitter on the first wait spreads executions that started together over the interval.
  // States.MathRandom's end is exclusive, so this draws 1..pollInterval.
  const drawDelay = new sfn.Pass(scope, STATE.drawPollDelay, {
    parameters: { delaySeconds: sfn.JsonPath.mathRandom(1, (spec.pollSeconds ?? 1) + 1) },
  });
  const firstWait = new sfn.Wait(scope, STATE.firstWait, { time: sfn.WaitTime.secondsPath('$.delaySeconds') });
  const polling = sfn.Chain.start(drawDelay).next(firstWait).next(poll);

  if (spec.acquireTimeout === undefined) {
    // Without a timeout the polling branch simply ends once it holds a permit.
    return waitForPermit.branch(polling);
  }

  const acquired = new sfn.Fail(scope, STATE.permitAcquired, {
    error: PERMIT_ACQUIRED,
    cause: 'Not an error: ends the Parallel early so that the body can start',
  });
  poll.next(acquired);
  claimOwn.next(acquired);
  const timer = new sfn.Wait(scope, STATE.acquireTimer, { time: sfn.WaitTime.duration(spec.acquireTimeout) }).next(
    new sfn.Fail(scope, STATE.acquireTimedOut, {
      error: ACQUIRE_TIMEOUT_ERROR,
      cause: `No permit became free within the acquire timeout of ${spec.acquireTimeout.toHumanString()}`,
    }),
  );
  return waitForPermit
    .branch(polling, timer)
    .addCatch(toBody, {
      errors: [PERMIT_ACQUIRED],
      resultPath: sfn.JsonPath.DISCARD,
    });
}

/** ConcurrencyControlledWorkflow.ACQUIRE_TIMEOUT_ERROR: the acquire timeout passed. */
export const ACQUIRE_TIMEOUT_ERROR = 'SemaphoreAcquireTimeout';

/** ConcurrencyControlledWorkflow.INVALID_LIMIT_ERROR: a limit from the input that is not a number of at least 1. */
export const INVALID_LIMIT_ERROR = 'SemaphoreInvalidLimit';

/** Marker error that ends the "Wait For Permit" Parallel once the polling branch holds a permit. */
const PERMIT_ACQUIRED = 'SemaphorePermitAcquired';

/** What the workflow's definition is rendered from: the props, validated and resolved. */
export interface DefinitionSpec {
  readonly body: sfn.IChainable;
  readonly lockName: RuntimeValue<string>;
  readonly limit: RuntimeValue<number>;
  readonly pollInterval: Duration;
  readonly pollSeconds?: number;
  readonly acquireTimeout?: Duration;
  readonly leaseSeconds?: number;
  readonly idempotency?: IdempotencyStates;
  readonly waitStrategy: WaitStrategy;
  readonly queueCheckInterval: Duration;
  readonly permitPath?: string;
}
