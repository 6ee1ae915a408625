import { Duration, Token } from 'aws-cdk-lib';
import * as sfn from 'aws-cdk-lib/aws-stepfunctions';
import * as tasks from 'aws-cdk-lib/aws-stepfunctions-tasks';
import { Construct } from 'constructs';
import { CONDITIONAL_CHECK_FAILED, SERVER_ERRORS, THROTTLING_ERRORS, transientRetry, VALIDATION_ERROR } from './dynamodb-errors';
import {
  COLLECT_ROUND_EVENTS,
  HISTORY_EVENT_LIMIT,
  QUEUE_CHECK_ROUND_EVENTS,
  QUEUE_RETRY_ROUND_EVENTS,
  slotWaitPacing,
  slotWaitSeconds,
  WAIT_ENTRY_EVENTS,
} from './history-budget';
import {
  ERROR_PATH as IDEMPOTENT_ERROR_PATH,
  IdempotencyStates,
  INPUT_PATH as IDEMPOTENT_INPUT_PATH,
  OUTPUT_PATH as IDEMPOTENT_OUTPUT_PATH,
} from './idempotency-states';
import {
  BODIES_RUNNING,
  BODY_LIMIT,
  BODY_SLOT_HELD_CONDITION,
  RELEASE_BODY_SLOT_AND_ENTRY_CONDITION,
  RELEASE_BODY_SLOT_AND_ENTRY_UPDATE,
  CLAIM_HANDED_CONDITION,
  COLLECT_GATE,
  COLLECTING,
  COMPLETE_COLLECTOR_CONDITION,
  COMPLETE_COLLECTOR_UPDATE,
  FENCING_TOKEN,
  GIVE_UP_HANDED_CONDITION,
  LOCK_KEY,
  LOCK_STRIPE_FIELD,
  LOCK_STRIPE_SEPARATOR,
  MAX_CONCURRENCY_LIMIT,
  MAX_PERMITS,
  NAMES,
  PERMITS_IN_USE,
  REGISTER_COLLECTOR_CONDITION,
  REGISTER_COLLECTOR_UPDATE,
  RELEASE_BODY_SLOT_CONDITION,
  RELEASE_BODY_SLOT_UPDATE,
  RELEASE_UPDATE,
  STILL_HELD_CONDITION,
  STILL_HELD_UPDATE,
  TAKE_BODY_SLOT_CONDITION,
  TAKE_BODY_SLOT_UPDATE,
  TICKET_KEY_SEPARATOR,
  VALUES,
} from './lock-schema';
import { acquireTask, currentRun, fencingTokenSelector, LockTaskProps, ownHolderKey, PermitWeight } from './lock-tasks';
import {
  claimStampValues,
  fencingTokenTask,
  HANDOFF_PATH,
  handOffChain,
  leaveQueueTask,
  POLLED_PERMIT_PATH,
  takeTicketTask,
  TICKET_PATH,
  WAIT_REFUSED,
  WAIT_TIMED_OUT,
  WAIT_UNCERTAIN,
  WaiterProps,
  waitOnTicketTask,
} from './queue-states';
import { EXECUTION_INPUT, pathFromExecutionInput, RuntimeValue } from './runtime-value';
import { RELEASE_AT_INTERVAL_FAILED, RELEASE_AT_INTERVAL_SUFFIX, STATE } from './state-names';
import { ISemaphoreTable } from '../semaphore-table';
import { WaitStrategy } from '../wait-strategy';

/*
 * The workflow's definition: acquire, the body in a Parallel, the release and its hand-off, and the
 * wait (in the queue, or polling), rendered from the validated props of ConcurrencyControlledWorkflow.
 */

/** Where a rate alone's Parallel puts the output of its release beside the body: its error, if it failed. */
const RELEASE_AT_INTERVAL_RESULT = 'releaseAtInterval';

/**
 * The definition:
 *
 *   Acquire Permit ──ok──▶ Run Protected Body ──ok──▶ Release Permit (hands off to a waiter if any)
 *     │ lock full                │ error                  (body output is the execution output)
 *     ▼                          ▼
 *   Take Ticket ──▶ Wait In Queue   Prepare Release After Failure ──▶ Release Permit After Failure ──▶ Fail
 *   (or Wait For Permit ──▶ …: the queue in a Parallel, or polling)
 *
 * The uncontended path is three transitions and two writes. A waiter adds two transitions and two
 * writes (its ticket, the wait on it; three transitions where the wait runs in the Parallel); a release
 * that hands off adds four transitions, three writes and a call (claim, serve, hand off, wake) beside its
 * refused give-back.
 */
export function renderDefinition(scope: Construct, table: ISemaphoreTable, spec: DefinitionSpec): sfn.IChainable {
  // The lock name, literal or a JSONPath string (the keys of the queue's ticket items start with it).
  const baseLockNameText =
    spec.lockName.inputPath === undefined ? spec.lockName.fixed! : sfn.JsonPath.stringAt(pathFromExecutionInput(spec.lockName.inputPath));
  // A split lock: the stripe drawn at the start, in the state data from then on (see pickLockStripe).
  const striped = spec.lockStripes !== undefined && spec.lockStripes > 1;
  // Split without idempotency, the input waits at HANDOFF_PATH until the body (idempotency keeps it at its payload).
  const inputAtHandoff = striped && spec.idempotency === undefined;
  const lockNameText = striped ? sfn.JsonPath.stringAt(STRIPED_LOCK_PATH) : baseLockNameText;
  const lockName = tasks.DynamoAttributeValue.fromString(lockNameText);
  const lockTask: LockTaskProps = { table: table, lockName, holder: ownHolderKey() };
  const limit =
    spec.limit.inputPath === undefined
      ? tasks.DynamoAttributeValue.fromNumber(spec.limit.fixed!)
      : tasks.DynamoAttributeValue.numberFromString(
        sfn.JsonPath.format('{}', sfn.JsonPath.stringAt(pathFromExecutionInput(spec.limit.inputPath))),
      );
  // With idempotency, the state data is the key function's result: the input at `$.payload`, which
  // the body's output replaces, an error at `$.error`; the record is completed after the release.
  const idem = spec.idempotency;
  // Split, the failure path keeps the stripe: the error takes the input's place (HANDOFF_PATH), and the
  // release's holder and run join it there.
  const errorPath = idem ? IDEMPOTENT_ERROR_PATH : inputAtHandoff ? HANDOFF_PATH : '$';
  // Where the body finds `{ fencingToken }`, in the state data before the body.
  const permitPath = spec.permitPath && (idem ? `${IDEMPOTENT_INPUT_PATH}${spec.permitPath.slice(1)}` : spec.permitPath);
  // The release reads its holder and run from the state data, so that it can also give back the
  // permit of a waiter it could not wake.
  const holderOfThisRun = {
    holder: ownHolderKey(),
    redriveCount: sfn.JsonPath.numberAt('$$.Execution.RedriveCount'),
  };

  // Failure path: give the permit back if we hold it, then fail with the error that brought us here.
  // Under a rate limit, only once the interval has passed: the body may have started just now (and
  // its failure ended the Parallel's Wait branch early).
  const failedWith = inputAtHandoff ? `${HANDOFF_PATH}.${STRIPED_ERROR_FIELD}` : errorPath;
  const failWithError = idem
    ? idem.markFailed
    : new sfn.Fail(scope, STATE.failWithError, { errorPath: `${failedWith}.Error`, causePath: `${failedWith}.Cause` });
  const prepareReleaseAfterFailure = new sfn.Pass(scope, STATE.prepareReleaseAfterFailure, {
    parameters: inputAtHandoff ? { ...holderOfThisRun, [STRIPED_ERROR_FIELD]: sfn.JsonPath.objectAt(HANDOFF_PATH) } : holderOfThisRun,
    resultPath: HANDOFF_PATH,
  });
  const weight = permitWeight(spec);
  const weighted = weight !== undefined;
  // A concurrency limit above the rate's count: the permit goes back at the interval and the body keeps
  // its slot in an entry of no permit (KEEP_SLOT_RELEASE), which goes with the slot after the Parallel.
  const keepSlot = spec.bodyLimit !== undefined && spec.releaseAtInterval === true;
  prepareReleaseAfterFailure.next(handOffChain(scope, { table: table, lockName, lockNameText, suffix: ' After Failure', next: failWithError, weighted }));
  let releaseAfterFailure: sfn.State = prepareReleaseAfterFailure;
  if (spec.holdSeconds !== undefined) {
    const holdAfterFailure = new sfn.Wait(scope, STATE.holdAfterFailure, { time: seconds(spec.holdSeconds) });
    holdAfterFailure.next(prepareReleaseAfterFailure);
    releaseAfterFailure = spec.releaseAtInterval
      ? checkPermitAfterFailure(scope, table, lockName, holdAfterFailure, failWithError)
      : holdAfterFailure;
  }
  if (spec.bodyLimit !== undefined) {
    // A failed body gives its slot back at once (its permit stays held for the interval); refused, it
    // held none (the failure came before the body, or after its release). Whatever the answer, the
    // release of the entry takes off what is left. (Above the rate's count, an entry whose permit went
    // back at the interval goes with its slot, first.)
    const ids = {
      release: STATE.releaseBodySlotAfterFailure,
      released: STATE.bodySlotReleasedAfterFailure,
      andEntry: STATE.releaseBodySlotAndEntryAfterFailure,
    };
    const { first, release, released } = releaseBodySlot(scope, table, lockName, ids, [sfn.Errors.ALL], keepSlot);
    release.next(releaseAfterFailure);
    released.next(releaseAfterFailure);
    releaseAfterFailure = first;
  }

  // Success path. The Parallel wraps the body's output in an array: `$[0]` unwraps it.
  let runBody: sfn.Parallel;
  let release: sfn.State;
  if (idem) {
    runBody = new sfn.Parallel(scope, STATE.runBody, { inputPath: IDEMPOTENT_INPUT_PATH, resultPath: IDEMPOTENT_OUTPUT_PATH });
    release = new sfn.Pass(scope, STATE.prepareRelease, { parameters: holderOfThisRun, resultPath: HANDOFF_PATH });
    (release as sfn.Pass).next(
      handOffChain(scope, { table: table, lockName, lockNameText, suffix: '', next: idem.saveResult, alreadyReleased: idem.saveResult, weighted }),
    );
  } else if (inputAtHandoff) {
    // The input waits at HANDOFF_PATH (see pickLockStripe), which the output and the release's holder
    // replace, beside the stripe.
    runBody = new sfn.Parallel(scope, STATE.runBody, {
      inputPath: HANDOFF_PATH,
      resultSelector: { output: sfn.JsonPath.objectAt('$[0]'), ...holderOfThisRun },
      resultPath: HANDOFF_PATH,
    });
    release = handOffChain(scope, { table: table, lockName, lockNameText, suffix: '', outputPath: `${HANDOFF_PATH}.output`, weighted });
  } else {
    // The output and the release's holder in one object, without a state of its own (and, with the
    // release beside the body, that release's failure, if it failed).
    runBody = new sfn.Parallel(scope, STATE.runBody, {
      resultSelector: {
        output: sfn.JsonPath.objectAt('$[0]'),
        handoff: holderOfThisRun,
        ...(spec.releaseAtInterval ? { [RELEASE_AT_INTERVAL_RESULT]: sfn.JsonPath.objectAt('$[1]') } : {}),
      },
    });
    release = handOffChain(scope, { table: table, lockName, lockNameText, suffix: '', outputPath: '$.output', weighted });
  }
  runBody
    .branch(spec.bodyLimit === undefined ? spec.body : bodyInSlot(scope, table, lockName, spec.body, keepSlot))
    // resultPath '$': the failure path needs only the error, and the lock name comes from the context.
    .addCatch(releaseAfterFailure, { errors: [sfn.Errors.ALL], resultPath: errorPath });
  if (spec.holdSeconds === undefined) {
    runBody.next(release);
  } else {
    // Under a rate limit the permit is held for at least the interval after the body starts: a second
    // branch waits it out beside the body (its output left out of the Parallel's). A redrive does not
    // run a branch that ended again, so a redriven run, whose body may just have started again, waits
    // the whole interval after the body before it releases.
    const hold = seconds(spec.holdSeconds);
    let notRedriven: sfn.IChainable = release;
    let releaseBesideFailed: string | undefined;
    if (!spec.releaseAtInterval) {
      runBody.branch(sfn.Wait.jsonPath(scope, STATE.holdForRate, { time: hold, outputPath: sfn.JsonPath.DISCARD }));
    } else {
      // A rate alone bounds the starts, not the bodies: the second branch gives the permit back (or
      // hands it on) once the interval has passed, while the body may still run. Its release reads the
      // run it was prepared in: resumed there by a redrive, it cannot free the permit that the redrive
      // guard took for the new run (its stamp is newer), which the Wait after the Parallel then holds
      // for the interval and gives back. A run that was not redriven has nothing left to give back.
      const suffix = RELEASE_AT_INTERVAL_SUFFIX;
      const releaseBeside = handOffChain(scope, { table, lockName, lockNameText, suffix, outputPath: sfn.JsonPath.DISCARD, weighted, keepSlot });
      // A write of that release throttled past its retries (or failing with server errors that long)
      // must not fail the branch, which would stop the body: the branch ends with the error as its
      // output, and the release after the body gives the permit back (or finds it handed on, if the
      // failed call landed). Other errors still fail the execution: they are not transient (access
      // denied, a malformed request). The wake-ups are calls of their own, which catch everything.
      const releaseFailed = new sfn.Succeed(scope, RELEASE_AT_INTERVAL_FAILED);
      for (const state of sfn.State.findReachableStates(releaseBeside, { includeErrorHandlers: true })) {
        if (state instanceof sfn.TaskStateBase) state.addCatch(releaseFailed, { errors: [...THROTTLING_ERRORS, ...SERVER_ERRORS], resultPath: '$' });
      }
      runBody.branch(
        sfn.Chain.start(new sfn.Pass(scope, STATE.prepareReleaseAtInterval, { parameters: { handoff: holderOfThisRun } }))
          .next(sfn.Wait.jsonPath(scope, STATE.holdForRate, { time: hold }))
          .next(releaseBeside),
      );
      releaseBesideFailed = `${idem ? `${IDEMPOTENT_OUTPUT_PATH}[1]` : `$.${RELEASE_AT_INTERVAL_RESULT}`}.Error`;
      notRedriven = idem ? idem.saveResult : new sfn.Succeed(scope, STATE.rateIntervalReleased, { outputPath: '$.output' });
    }
    const holdAfterRedrive = new sfn.Wait(scope, STATE.holdAfterRedrive, { time: hold }).next(release);
    const redriven = new sfn.Choice(scope, STATE.redrivenRun).when(sfn.Condition.numberGreaterThan('$$.Execution.RedriveCount', 0), holdAfterRedrive);
    // The same Choice (no transition more) sends a run whose release beside the body failed to the release.
    if (releaseBesideFailed) redriven.when(sfn.Condition.isPresent(releaseBesideFailed), release);
    redriven.otherwise(notRedriven);
    if (!keepSlot) {
      runBody.next(redriven);
    } else {
      // The body's slot goes once both branches have ended (the body, and the release of the permit at
      // the interval), so that no two states of the execution change its entry at once: with its entry
      // if the permit went back at the interval, else the slot alone (the release beside the body
      // failed, or the run was redriven), before the release after the body. A body shorter than the
      // interval keeps its slot until then: at most the rate's count of them, below the concurrency limit.
      // A write throttled (or failing with server errors) past its retries does not fail a body that
      // succeeded: the slot goes on, and what the entry still holds is the sweep's (its execution ended).
      const ids = { release: STATE.releaseBodySlot, released: STATE.bodySlotReleased, andEntry: STATE.releaseBodySlotAndEntry };
      const slot = releaseBodySlot(scope, table, lockName, ids, [CONDITIONAL_CHECK_FAILED, ...THROTTLING_ERRORS, ...SERVER_ERRORS], true);
      slot.release.next(slot.released);
      slot.released.next(redriven);
      runBody.next(slot.first);
    }
  }

  // With a body slot, every way into the body takes one first.
  let bodyGate: sfn.State = runBody;
  let slotGate: BodySlotGate | undefined;
  if (spec.bodyLimit !== undefined) {
    slotGate = bodySlotGate(scope, table, lockName, spec, permitPath, releaseAfterFailure, errorPath);
    slotGate.take.next(runBody);
    slotGate.wait.next(runBody);
    bodyGate = slotGate.take;
  }

  // A permit taken inside a Parallel (whose result is discarded) reads its fencing token after it.
  // (Only where a Parallel takes the permit: polling, or the queue with an acquire timeout.)
  let toBody: sfn.State = bodyGate;
  // (With a body slot, its take draws the token.)
  if (permitPath && spec.bodyLimit === undefined && (spec.waitStrategy === WaitStrategy.POLLING || spec.acquireTimeout !== undefined)) {
    const readToken = fencingTokenTask(scope, STATE.readFencingToken, { table: table, lockName, permitPath, weight: weight?.permits });
    toBody = readToken.addCatch(releaseAfterFailure, { errors: [sfn.Errors.ALL], resultPath: errorPath });
    (toBody as sfn.TaskStateBase).next(bodyGate);
  }

  let waitForPermit: sfn.State;
  if (spec.waitStrategy === WaitStrategy.QUEUE) {
    const queue = renderQueueWait(scope, table, spec, lockTask, lockNameText, limit, toBody, permitPath, weight);
    queue.parallel.addCatch(releaseAfterFailure, { errors: [sfn.Errors.ALL], resultPath: errorPath });
    queue.parallel.next(spec.acquireTimeout === undefined ? bodyGate : toBody);
    if (queue.firstWait) {
      queue.firstWait.takeTicket.addCatch(releaseAfterFailure, { errors: [sfn.Errors.ALL], resultPath: errorPath });
      queue.firstWait.waitInQueue.addCatch(releaseAfterFailure, { errors: [sfn.Errors.ALL], resultPath: errorPath }).next(bodyGate);
    }
    waitForPermit = queue.entry;
  } else {
    const polling = renderWaitForPermit(scope, table, spec, lockTask, limit, toBody, weight);
    polling.addCatch(releaseAfterFailure, { errors: [sfn.Errors.ALL], resultPath: errorPath });
    polling.next(toBody);
    waitForPermit = polling;
  }

  // The acquire found this execution's own entry (see ACQUIRE_CONDITION): a permit it holds already,
  // taken by a write of its stopped run that landed late, or by a write whose response was lost.
  // It claims that permit for its current run; if it was freed meanwhile, it waits for one.
  const claimOwn = fencingTokenTask(scope, STATE.claimOwnPermit, { table: table, lockName, permitPath, weight: weight?.permits })
    .addCatch(waitForPermit, { errors: [CONDITIONAL_CHECK_FAILED], resultPath: sfn.JsonPath.DISCARD })
    .addCatch(releaseAfterFailure, { errors: [sfn.Errors.ALL], resultPath: errorPath })
    .next(bodyGate);

  // A server error leaves it open whether the write landed: try again. If it did land, the retry
  // finds the execution's own entry, and the execution claims it.
  const rateIntervalSeconds = spec.holdSeconds;
  const acquire = acquireTask(scope, STATE.acquire, {
    ...lockTask,
    limit,
    leaseSeconds: spec.leaseSeconds,
    permitPath,
    rateIntervalSeconds,
    weight,
    bodyLimit: spec.bodyLimit,
  })
    .addRetry(transientRetry([...THROTTLING_ERRORS, ...SERVER_ERRORS]))
    .addCatch(waitForPermit, { errors: [CONDITIONAL_CHECK_FAILED], resultPath: sfn.JsonPath.DISCARD })
    .addCatch(claimOwn, { errors: [VALIDATION_ERROR], resultPath: sfn.JsonPath.DISCARD })
    .next(bodyGate);
  // A body slot's entry is gone (freed while the execution was stopped, or its lease expired): acquire again.
  slotGate?.take.addCatch(acquire, { errors: [VALIDATION_ERROR], resultPath: sfn.JsonPath.DISCARD });
  slotGate?.wait.addCatch(acquire, { errors: [VALIDATION_ERROR], resultPath: sfn.JsonPath.DISCARD });
  slotGate?.take.addCatch(releaseAfterFailure, { errors: [sfn.Errors.ALL], resultPath: errorPath });
  slotGate?.wait.addCatch(releaseAfterFailure, { errors: [sfn.Errors.ALL], resultPath: errorPath });
  const drawn = (head: sfn.IChainable) =>
    striped ? pickLockStripe(scope, baseLockNameText, spec.lockStripes!, idem !== undefined).next(head) : head;
  const start = (head: sfn.IChainable) => (idem ? idem.start(drawn(head)) : drawn(head));
  // With idempotency too, the checks come first: an invalid input never claims a record.
  return checkRuntimeLockName(scope, spec, checkRuntimeLimit(scope, spec, checkRuntimePermits(scope, spec, start(acquire))));
}

/**
 * The acquire's values of a weighted workflow (`permits` other than a fixed 1): the permits, and the
 * gate `limit - permits` (an acquire takes them while `permitsInUse <= gate`), computed at synth when
 * both are fixed, else by intrinsic functions in the acquire's parameters (a negated weight is
 * `States.StringToJson('-' + weight)`: the intrinsics cannot subtract).
 */
function permitWeight(spec: DefinitionSpec): PermitWeight | undefined {
  const permits = spec.permits;
  if (permits === undefined || (permits.inputPath === undefined && permits.fixed === 1)) return undefined;
  const number = (n: number) => tasks.DynamoAttributeValue.fromNumber(n);
  const computed = (sum: string) => tasks.DynamoAttributeValue.numberFromString(sfn.JsonPath.format('{}', sum));
  if (permits.inputPath === undefined) {
    const w = permits.fixed!;
    const limitPath = spec.limit.inputPath;
    const gate = limitPath === undefined ? number(spec.limit.fixed! - w) : computed(sfn.JsonPath.mathAdd(limitFromInput(limitPath), -w));
    const collectGate =
      limitPath === undefined ? number(spec.limit.fixed! - w + 1) : computed(sfn.JsonPath.mathAdd(limitFromInput(limitPath), 1 - w));
    return { permits: number(w), gate, extra: number(w - 1), collectGate };
  }
  const w = sfn.JsonPath.numberAt(pathFromExecutionInput(permits.inputPath));
  const negated = Token.asNumber(sfn.JsonPath.stringToJson(sfn.JsonPath.format('-{}', sfn.JsonPath.stringAt(pathFromExecutionInput(permits.inputPath)))));
  const limitNumber = spec.limit.inputPath === undefined ? spec.limit.fixed! : limitFromInput(spec.limit.inputPath);
  return {
    permits: tasks.DynamoAttributeValue.numberFromString(sfn.JsonPath.format('{}', sfn.JsonPath.stringAt(pathFromExecutionInput(permits.inputPath)))),
    gate: computed(sfn.JsonPath.mathAdd(limitNumber, negated)),
    extra: computed(sfn.JsonPath.mathAdd(w, -1)),
    collectGate: computed(sfn.JsonPath.mathAdd(Token.asNumber(sfn.JsonPath.mathAdd(limitNumber, negated)), 1)),
  };
}

function limitFromInput(path: string): number {
  return sfn.JsonPath.numberAt(pathFromExecutionInput(path));
}

/**
 * A rate alone's failure path: the release beside the body gives the permit back once the interval has
 * passed, so a body that fails later holds none, and its execution fails at once instead of waiting out
 * another interval. A no-op write conditional on the entry (stamped by this run or an earlier one)
 * tells: refused, nothing is held; else the permit is held for the interval, as with a concurrency
 * limit, and given back. A redriven run (whose body may run without a permit until its guard acts) and
 * a check that fails for any other reason take the wait too.
 */
function checkPermitAfterFailure(
  scope: Construct,
  table: ISemaphoreTable,
  lockName: tasks.DynamoAttributeValue,
  holdAfterFailure: sfn.State,
  failWithError: sfn.IChainable,
): sfn.State {
  const check = new tasks.DynamoUpdateItem(scope, STATE.checkPermitAfterFailure, {
    table: table.table,
    key: { [LOCK_KEY]: lockName },
    conditionExpression: STILL_HELD_CONDITION,
    updateExpression: STILL_HELD_UPDATE,
    expressionAttributeNames: { [NAMES.permits]: PERMITS_IN_USE, [NAMES.holder]: ownHolderKey() },
    expressionAttributeValues: {
      [VALUES.redriveCount]: currentRun(),
    },
    resultPath: sfn.JsonPath.DISCARD,
  })
    .addRetry(transientRetry([...THROTTLING_ERRORS, ...SERVER_ERRORS]))
    .addCatch(failWithError, { errors: [CONDITIONAL_CHECK_FAILED], resultPath: sfn.JsonPath.DISCARD })
    .addCatch(holdAfterFailure, { errors: [sfn.Errors.ALL], resultPath: sfn.JsonPath.DISCARD })
    .next(holdAfterFailure);
  return new sfn.Choice(scope, STATE.redrivenRunAfterFailure)
    .when(sfn.Condition.numberGreaterThan('$$.Execution.RedriveCount', 0), holdAfterFailure)
    .otherwise(check);
}

/**
 * The failure of a value read from the input that a check refused: its cause says what is allowed and
 * quotes the value it got (`quoted`; `also` quotes several, with a cause of its own), or says that
 * there was none (`missing`). A Pass state writes the cause, since the simulator's Fail state reads
 * `CausePath` as a path only; it costs two transitions on the failure only.
 */
function invalidInput(
  scope: Construct,
  props: {
    error: string;
    fail: string;
    quote: string;
    missing?: string;
    path: string;
    cause: string;
    /** A second quoting failure: its cause as texts with a value read from `paths` between each two. */
    also?: { quote: string; texts: string[]; paths: string[] };
  },
): { quoted: sfn.IChainable; missing: sfn.IChainable; also: sfn.IChainable } {
  const fail = new sfn.Fail(scope, props.fail, { error: props.error, causePath: '$.Cause' });
  // The texts name input paths, which may hold quotes or braces (`$['limit']`): as literals of an
  // intrinsic function they would need escapes (which asl-validator refuses), so they go in as plain
  // parameters beside the values as JSON text, and a second Pass joins them.
  const quote = (id: string, texts: string[], paths: string[]) => {
    if (texts.length !== paths.length + 1) throw new Error(`invalidInput: ${texts.length} texts around ${paths.length} values`);
    const parameters: Record<string, string> = {};
    const parts: string[] = [];
    texts.forEach((text, i) => {
      parameters[`Text${i}`] = text;
      parts.push(sfn.JsonPath.stringAt(`$.Text${i}`));
      if (i === paths.length) return;
      parameters[`Value${i}`] = sfn.JsonPath.jsonToString(sfn.JsonPath.objectAt(paths[i]));
      parts.push(sfn.JsonPath.stringAt(`$.Value${i}`));
    });
    const cause = sfn.JsonPath.format('{}'.repeat(parts.length), ...parts);
    const format = new sfn.Pass(scope, CAUSE_FORMAT_STATES[id], { parameters: { Cause: cause }, resultPath: '$' }).next(fail);
    return new sfn.Pass(scope, id, { parameters, resultPath: '$' }).next(format);
  };
  const quoted = quote(props.quote, [`${props.cause}, got: `, ''], [props.path]);
  const missing = props.missing
    ? new sfn.Pass(scope, props.missing, { parameters: { Cause: `${props.cause}, got none` }, resultPath: '$' }).next(fail)
    : quoted;
  const also = props.also ? quote(props.also.quote, props.also.texts, props.also.paths) : quoted;
  return { quoted, missing, also };
}

/** The Pass that joins a quoting failure's cause, by the Pass that gathers its parts. */
const CAUSE_FORMAT_STATES: Record<string, string> = {
  [STATE.quoteInvalidLimit]: STATE.formatInvalidLimitCause,
  [STATE.quoteInvalidPermits]: STATE.formatInvalidPermitsCause,
  [STATE.quotePermitsAboveLimit]: STATE.formatPermitsAboveLimitCause,
};

/**
 * `permits` read from the input is checked before the first acquire, as the limit is: a missing or
 * non-numeric weight would fail the acquire's parameters, one below 1 would give permits away, and
 * one above the limit would wait forever. One more transition, only here; nothing is held yet.
 */
function checkRuntimePermits(scope: Construct, spec: DefinitionSpec, next: sfn.IChainable): sfn.IChainable {
  const path = spec.permits?.inputPath;
  const limitPath = spec.limit.inputPath;
  if (path === undefined) {
    // A fixed weight beside a limit from the input: the limit must hold the weight (on a lock item
    // not written yet, the acquire's condition does not compare them).
    const fixed = spec.permits?.fixed;
    if (fixed === undefined || fixed === 1 || limitPath === undefined) return next;
    const tooMany = invalidInput(scope, {
      error: INVALID_PERMITS_ERROR,
      fail: STATE.runtimePermitsInvalid,
      quote: STATE.quoteInvalidPermits,
      path: limitPath,
      cause: `The concurrency limit read from the execution input at ${limitPath} must be at least the workflow's permits, ${fixed}`,
    }).quoted;
    return new sfn.Choice(scope, STATE.checkRuntimePermits).when(sfn.Condition.numberLessThan(limitPath, fixed), tooMany).otherwise(next);
  }
  const invalid = invalidInput(scope, {
    error: INVALID_PERMITS_ERROR,
    fail: STATE.runtimePermitsInvalid,
    quote: STATE.quoteInvalidPermits,
    missing: STATE.runtimePermitsMissing,
    path,
    cause: `The permits read from the execution input at ${path} must be an integer from 1 to ${MAX_PERMITS}, and at most the concurrency limit`,
    also:
      limitPath === undefined
        ? undefined
        : {
          quote: STATE.quotePermitsAboveLimit,
          texts: [`The permits read from the execution input at ${path} must be at most the concurrency limit read from it at ${limitPath}, got: `, ' and ', ''],
          paths: [path, limitPath],
        },
  });
  const aboveLimit =
    limitPath === undefined ? sfn.Condition.numberGreaterThan(path, spec.limit.fixed!) : sfn.Condition.numberGreaterThanJsonPath(path, limitPath);
  // A Choice cannot test for an integer, but it can test for each of the MAX_PERMITS allowed values.
  const allowed = Array.from({ length: MAX_PERMITS }, (_, i) => sfn.Condition.numberEquals(path, i + 1));
  return new sfn.Choice(scope, STATE.checkRuntimePermits)
    .when(sfn.Condition.not(sfn.Condition.isPresent(path)), invalid.missing)
    .when(sfn.Condition.not(sfn.Condition.isNumeric(path)), invalid.quoted)
    .when(sfn.Condition.not(sfn.Condition.or(...allowed)), invalid.quoted)
    .when(aboveLimit, invalid.also)
    .otherwise(next);
}

/**
 * A limit read from the input is checked before the first acquire: on a lock nobody holds yet the
 * condition `attribute_not_exists(permits)` would let one execution in whatever the limit, a limit
 * below 1 would make every other execution wait forever, and one above MAX_CONCURRENCY_LIMIT could
 * grow the lock item past DynamoDB's 400 KB. One more transition, only here; nothing is held yet.
 */
function checkRuntimeLimit(scope: Construct, spec: DefinitionSpec, next: sfn.IChainable): sfn.IChainable {
  if (spec.limit.inputPath === undefined) return next;
  const invalidLimit = invalidInput(scope, {
    error: INVALID_LIMIT_ERROR,
    fail: STATE.runtimeLimitInvalid,
    quote: STATE.quoteInvalidLimit,
    missing: STATE.runtimeLimitMissing,
    path: spec.limit.inputPath,
    cause: `The concurrency limit read from the execution input at ${spec.limit.inputPath} must be a number from 1 to ${MAX_CONCURRENCY_LIMIT}`,
  });
  return new sfn.Choice(scope, STATE.checkRuntimeLimit)
    .when(sfn.Condition.not(sfn.Condition.isPresent(spec.limit.inputPath)), invalidLimit.missing)
    .when(sfn.Condition.not(sfn.Condition.isNumeric(spec.limit.inputPath)), invalidLimit.quoted)
    .when(sfn.Condition.numberLessThan(spec.limit.inputPath, 1), invalidLimit.quoted)
    .when(sfn.Condition.numberGreaterThan(spec.limit.inputPath, MAX_CONCURRENCY_LIMIT), invalidLimit.quoted)
    .otherwise(next);
}

/**
 * A lock name read from the input is checked too: a name with the ticket key separator could name
 * another lock's ticket item (lock `a` + U+001F + `1` is ticket 1 of lock `a`), and an empty one is
 * no DynamoDB key. One more transition, only here. (Its length is not checked: a Choice cannot; a
 * name over DynamoDB's 2,048-byte key limit fails the acquire with a ValidationException.)
 */
function checkRuntimeLockName(scope: Construct, spec: DefinitionSpec, next: sfn.IChainable): sfn.IChainable {
  const path = spec.lockName.inputPath;
  if (path === undefined) return next;
  const invalidName = new sfn.Fail(scope, STATE.runtimeLockNameInvalid, {
    error: INVALID_LOCK_NAME_ERROR,
    cause: `The lock name read from the execution input at ${path} must be a non-empty string without the character U+001F`,
  });
  return new sfn.Choice(scope, STATE.checkRuntimeLockName)
    .when(sfn.Condition.not(sfn.Condition.isPresent(path)), invalidName)
    .when(sfn.Condition.not(sfn.Condition.isString(path)), invalidName)
    .when(sfn.Condition.stringEquals(path, ''), invalidName)
    .when(sfn.Condition.stringMatches(path, `*${TICKET_KEY_SEPARATOR}*`), invalidName)
    .otherwise(next);
}

/**
 * The queue, in the "Wait For Permit" Parallel (its own copy of the state data keeps the ticket out
 * of the body's input), or its first wait outside it (see flatFirstWait, where the names of the
 * branch's "Take Ticket" and "Wait In Queue" are "Take New Ticket" and "Wait In Queue On New Ticket").
 * "Take Ticket" takes a place in the queue while the lock is full, and "Wait In
 * Queue" writes the ticket's item with its task token and sleeps until a releaser hands the execution
 * a permit. When the wait times out, the execution tries to take a permit (which also finds one handed
 * to it whose wake-up was lost), then sleeps again on the same ticket. When a wait is refused (the
 * ticket's turn has come: it was served, and its wake-up lost or the permit taken back, or skipped),
 * it checks for a handed-off permit and tries once to take one before it takes a new ticket:
 *
 *   Take Ticket ─▶ Wait In Queue ─woken─▶ body; timed out ─▶ Poll For Permit Again ─full─▶ Wait In Queue Again
 *     │ refused: a permit is free,       │ refused
 *     │ or it holds one                  ▼
 *     │                                Check Handed-Off Permit ─yes─▶ body; no ─▶ Poll For Permit
 *     ▼
 *   Poll For Permit ─yes─▶ body; full ─▶ Take Ticket; it holds one ─▶ Check Handed-Off Permit Again
 *
 *   Wait In Queue Again ─woken─▶ body; timed out ─▶ Poll For Permit Again
 *     │ refused
 *     ▼
 *   Check Handed-Off Permit Again ─yes─▶ body; no ─▶ Wait Before Next Poll ─▶ Take Ticket
 *
 *   Poll For Permit Again ─took a free permit─▶ Leave Queue (delete the ticket's item) ─▶ body
 *
 * Every way back to a wait counts its round against the history budget: "Count Queue Check" (and its
 * Choice) before Wait In Queue Again, "Count Queue Retry" before a new Take Ticket. Past the budget
 * the branch fails with SemaphoreAcquireTimeout ("Wait Budget Spent").
 *
 * With an `acquireTimeout`, a timer runs beside these states, as beside the polling states.
 */
function renderQueueWait(
  scope: Construct,
  table: ISemaphoreTable,
  spec: DefinitionSpec,
  lockTask: LockTaskProps,
  lockNameText: string,
  limit: tasks.DynamoAttributeValue,
  toBody: sfn.State,
  permitPath: string | undefined,
  weight: PermitWeight | undefined,
): QueueWait {
  const withTimer = spec.acquireTimeout !== undefined;
  // The first wait runs outside the Parallel where the body's input is the execution's and nothing but
  // the ticket needs carrying (see flatFirstWait): one transition less a waiter.
  const flat = firstWaitOutsideParallel(spec);
  // With a timer, success ends the branch with the marker error and the fencing token is read after
  // the Parallel. Without, the branch ends with `{ fencingToken }` as its whole state, which the
  // Parallel's result selector takes to the permit path.
  const marker = withTimer
    ? new sfn.Fail(scope, STATE.permitAcquired, { error: PERMIT_ACQUIRED, cause: 'Not an error: ends the Parallel early so that the body can start' })
    : undefined;
  const ownPermitPath = !withTimer && permitPath ? '$' : undefined;
  const acquired = <T extends sfn.State & sfn.INextable>(state: T): T => {
    if (marker) state.next(marker);
    return state;
  };

  const waiter = {
    table: table,
    lockName: lockTask.lockName,
    lockNameText,
    limit,
    leaseSeconds: spec.leaseSeconds ?? 0,
    checkInterval: spec.queueCheckInterval,
    // A weighted waiter is woken with one permit and collects the rest: its token comes from the completion.
    permitPath: weight ? sfn.JsonPath.DISCARD : ownPermitPath,
    gate: weight?.gate,
    rateIntervalSeconds: spec.holdSeconds,
  };
  const retry = transientRetry([...THROTTLING_ERRORS, ...SERVER_ERRORS]);
  const takeTicket = takeTicketTask(scope, flat ? STATE.takeNewTicket : STATE.takeTicket, waiter).addRetry(retry);
  const waitInQueue = waitOnTicketTask(scope, flat ? STATE.waitOnNewTicket : STATE.waitInQueue, waiter, false);
  const waitAgain = waitOnTicketTask(scope, STATE.waitInQueueAgain, waiter, true);

  // The history budget: every round back to a wait counts the events it spent, and past the budget
  // the execution gives up with the acquire-timeout error (the Parallel's catch then gives back what
  // it may hold, and its ticket is skipped when its turn comes). Two transitions a round, only on
  // rounds: a waiter woken in its first wait spends none of it.
  const budget = spec.waitEvents - WAIT_ENTRY_EVENTS;
  const budgetSpent = new sfn.Fail(scope, STATE.waitBudgetSpent, {
    error: ACQUIRE_TIMEOUT_ERROR,
    cause: `Gave up waiting for a permit: the wait spent its budget of ${spec.waitEvents} history events (Step Functions fails an execution at ${HISTORY_EVENT_LIMIT})`,
  });
  const countRound = (countId: string, checkId: string, events: number, next: sfn.State) =>
    new sfn.Pass(scope, countId, {
      parameters: { events: sfn.JsonPath.mathAdd(sfn.JsonPath.numberAt(`${WAIT_EVENTS_PATH}.events`), events) },
      resultPath: WAIT_EVENTS_PATH,
    }).next(new sfn.Choice(scope, checkId).when(sfn.Condition.numberGreaterThan(`${WAIT_EVENTS_PATH}.events`, budget), budgetSpent).otherwise(next));
  const checkRound = countRound(STATE.countQueueCheck, STATE.queueCheckWithinBudget, QUEUE_CHECK_ROUND_EVENTS, waitAgain);
  const retryRound = countRound(STATE.countQueueRetry, STATE.queueRetryWithinBudget, QUEUE_RETRY_ROUND_EVENTS, takeTicket);
  const nextWait = new sfn.Wait(scope, STATE.nextWait, { time: sfn.WaitTime.duration(spec.pollInterval) }).next(retryRound);
  const checkProps = { table: table, lockName: lockTask.lockName, permitPath: ownPermitPath };
  const acquireProps = {
    ...lockTask,
    limit,
    leaseSeconds: spec.leaseSeconds,
    permitPath: ownPermitPath,
    rateIntervalSeconds: spec.holdSeconds,
    weight,
    bodyLimit: spec.bodyLimit,
  };
  const collect = weight ? renderCollector(scope, table, spec, lockTask, weight, ownPermitPath, acquired, retryRound, countRound) : undefined;
  // Woken: a waiter of one permit has it; a weighted waiter holds one of its permits and collects the rest.
  for (const wait of [waitInQueue, waitAgain]) {
    if (collect) wait.next(collect.register);
    else acquired(wait);
  }
  // Found the execution's own entry (handed to it meanwhile, or taken by a write of an earlier run):
  // claim it; if it went meanwhile, take a new ticket after a pause. A weighted waiter's entry holds
  // one permit (handed off: it collects the rest) or all of them (its own acquire that landed late).
  const checkAgain = collect
    ? collect.claimHanded(STATE.checkHandedOffAgain, STATE.checkAllPermitsAgain, nextWait)
    : acquired(fencingTokenTask(scope, STATE.checkHandedOffAgain, checkProps)).addCatch(nextWait, {
      errors: [CONDITIONAL_CHECK_FAILED],
      resultPath: sfn.JsonPath.DISCARD,
    });
  // Server errors are retried: a write that landed makes the retry find the execution's own entry.
  const poll = acquired(acquireTask(scope, STATE.poll, acquireProps))
    .addRetry(retry)
    .addCatch(retryRound, { errors: [CONDITIONAL_CHECK_FAILED], resultPath: sfn.JsonPath.DISCARD })
    .addCatch(checkAgain, { errors: [VALIDATION_ERROR], resultPath: sfn.JsonPath.DISCARD });
  const check = collect
    ? collect.claimHanded(STATE.checkHandedOff, STATE.checkAllPermits, poll)
    : acquired(fencingTokenTask(scope, STATE.checkHandedOff, checkProps)).addCatch(poll, {
      errors: [CONDITIONAL_CHECK_FAILED],
      resultPath: sfn.JsonPath.DISCARD,
    });
  // A wait timed out (no wake-up within the check interval): take a free permit, or the one handed to
  // this execution if its wake-up was lost (the acquire finds its own entry); else sleep again.
  // A free permit taken, the ticket still waits: leave the queue (see leaveQueueTask). The branch's
  // result is `{ fencingToken }` alone, so the acquire's goes aside until the ticket is left.
  const polledPermitPath = ownPermitPath ? POLLED_PERMIT_PATH : undefined;
  const leaveQueue = acquired(leaveQueueTask(scope, STATE.leaveQueue, waiter, polledPermitPath));
  // Refused (served meanwhile) or failing: the ticket stays, and the execution goes in with the permit
  // it polled. Unless this is a redriven run (resumed at Leave Queue, whose ticket is the run before's:
  // always refused): that run took the entry, which a cleanup may have freed since, so this one claims
  // it first (Check Handed-Off Permit Again stamps it with this run, or queues again if it is gone).
  const ticketLeft = acquired(new sfn.Pass(scope, STATE.ticketLeftInQueue, { outputPath: polledPermitPath }));
  const leaveRefused = new sfn.Choice(scope, STATE.redrivenAtLeaveQueue)
    .when(sfn.Condition.numberGreaterThan('$$.Execution.RedriveCount', 0), checkAgain)
    .otherwise(ticketLeft);
  leaveQueue.addCatch(leaveRefused, {
    errors: [CONDITIONAL_CHECK_FAILED, ...THROTTLING_ERRORS, ...SERVER_ERRORS],
    resultPath: sfn.JsonPath.DISCARD,
  });
  const pollAgain = acquireTask(scope, STATE.pollAgain, { ...acquireProps, permitPath: polledPermitPath })
    .addRetry(retry)
    .addCatch(checkRound, { errors: [CONDITIONAL_CHECK_FAILED], resultPath: sfn.JsonPath.DISCARD })
    .addCatch(checkAgain, { errors: [VALIDATION_ERROR], resultPath: sfn.JsonPath.DISCARD });
  pollAgain.next(leaveQueue);

  // Refused: the lock has a free permit, or this execution already holds one (handed over while it
  // was not waiting: after a lost wake-up, or to an older ticket of it). Take the free permit: the
  // acquire also tells the second case (ValidationException: it holds one), which it then claims.
  // Polling first saves a refused claim, a write billed at the lock item's size, on the common case
  // (a lock that flips between full and not full under load).
  takeTicket.addCatch(poll, { errors: [CONDITIONAL_CHECK_FAILED], resultPath: sfn.JsonPath.DISCARD });
  takeTicket.next(waitInQueue);
  waitInQueue.addCatch(pollAgain, { errors: WAIT_TIMED_OUT, resultPath: sfn.JsonPath.DISCARD });
  // Refused: the ticket's turn has come (served: the wake-up was lost, or the permit was taken back;
  // or skipped, the execution being on its way), or the ticket is of a stopped run of this execution.
  waitInQueue.addCatch(check, { errors: [...WAIT_REFUSED, ...WAIT_UNCERTAIN], resultPath: sfn.JsonPath.DISCARD });
  waitAgain.addCatch(pollAgain, { errors: WAIT_TIMED_OUT, resultPath: sfn.JsonPath.DISCARD });
  waitAgain.addCatch(checkAgain, { errors: WAIT_REFUSED, resultPath: sfn.JsonPath.DISCARD });
  waitAgain.addCatch(check, { errors: WAIT_UNCERTAIN, resultPath: sfn.JsonPath.DISCARD });

  // The branches start from an object of their own, not the execution's data: they write the ticket
  // and the count of their rounds into their state, which an input that is not an object (a string, a
  // number, an array) cannot hold.
  const rounds = { [WAIT_EVENTS_PATH.slice(2)]: { events: 0 } };
  if (flat) {
    return flatFirstWait(scope, waiter, rounds, { poll, pollAgain, check }, retry);
  }
  const props: sfn.ParallelProps = {
    parameters: { ...rounds, ...stripeInBranch(spec) },
    ...(withTimer || !permitPath
      ? { resultPath: sfn.JsonPath.DISCARD }
      : { resultSelector: { fencingToken: sfn.JsonPath.objectAt('$[0].fencingToken') }, resultPath: permitPath }),
  };
  const waitForPermit = new sfn.Parallel(scope, STATE.waitForPermit, props);
  if (!withTimer) {
    waitForPermit.branch(takeTicket);
    return { entry: waitForPermit, parallel: waitForPermit };
  }
  const timer = new sfn.Wait(scope, STATE.acquireTimer, { time: sfn.WaitTime.duration(spec.acquireTimeout!) }).next(
    new sfn.Fail(scope, STATE.acquireTimedOut, {
      error: ACQUIRE_TIMEOUT_ERROR,
      cause: `No permit became free within the acquire timeout of ${spec.acquireTimeout!.toHumanString()}`,
    }),
  );
  waitForPermit.branch(takeTicket, timer).addCatch(toBody, { errors: [PERMIT_ACQUIRED], resultPath: sfn.JsonPath.DISCARD });
  return { entry: waitForPermit, parallel: waitForPermit };
}

/**
 * Whether the queue's first wait runs outside the "Wait For Permit" Parallel (see flatFirstWait): the
 * queue, the state data the execution's input (no idempotency, no split lock: their own state data
 * holds the input, and the ticket beside it would take room an input close to the payload quota has
 * not got, after the ticket was taken), and nothing else to carry through the wait (no acquire timer,
 * weight, fencing token or rate).
 */
export function firstWaitOutsideParallel(spec: DefinitionSpec): boolean {
  return (
    spec.waitStrategy === WaitStrategy.QUEUE &&
    spec.idempotency === undefined &&
    (spec.lockStripes ?? 1) === 1 &&
    permitWeight(spec) === undefined &&
    spec.permitPath === undefined &&
    spec.acquireTimeout === undefined &&
    spec.holdSeconds === undefined &&
    spec.bodyLimit === undefined
  );
}

/** The queue's states as the definition wires them. */
interface QueueWait {
  /** Where a refused acquire goes. */
  readonly entry: sfn.State;
  /** The "Wait For Permit" Parallel: its success goes to the body, its failure to the release after failure. */
  readonly parallel: sfn.Parallel;
  /** The first wait outside the Parallel, if so rendered: a wake-up goes to the body, an error to the release after failure. */
  readonly firstWait?: { readonly takeTicket: sfn.TaskStateBase; readonly waitInQueue: sfn.TaskStateBase };
}

/** Where a first wait outside the Parallel puts, beside its ticket, the error of a wait that timed out, or that was refused. */
const FIRST_WAIT_TIMED_OUT = 'timedOut';
const FIRST_WAIT_REFUSED = 'refused';

/**
 * The first wait outside the "Wait For Permit" Parallel, which costs each waiter a transition (where
 * firstWaitOutsideParallel). "Take Ticket" replaces the state data, the execution's input (which need not
 * be an object), with `{ ticket }`, and a wake-up of "Wait In Queue" goes to the body with the
 * execution's input from the context (`OutputPath: $$.Execution.Input`, which Step Functions allows:
 * https://docs.aws.amazon.com/step-functions/latest/dg/input-output-contextobject.html).
 *
 * Every other end enters the Parallel with the ticket, and "Resume Wait" goes on where the branch would
 * have: a refused ticket (its error in the ticket's place) to "Poll For Permit", a wait that timed out
 * (its error beside the ticket, at `timedOut`) to "Poll For Permit Again" on its ticket, a refused (or
 * uncertain) wait (at `refused`) to "Check Handed-Off Permit". From there the branch is the one described
 * above, its new tickets taken by "Take New Ticket" and "Wait In Queue On New Ticket"; its success also
 * leaves the body the execution's input.
 */
function flatFirstWait(
  scope: Construct,
  waiter: WaiterProps,
  rounds: Record<string, unknown>,
  branch: { poll: sfn.State; pollAgain: sfn.State; check: sfn.State },
  retry: sfn.RetryProps,
): QueueWait {
  const takeTicket = takeTicketTask(scope, STATE.takeTicket, waiter, '$').addRetry(retry);
  const waitInQueue = waitOnTicketTask(scope, STATE.waitInQueue, waiter, false, '$', EXECUTION_INPUT);
  takeTicket.next(waitInQueue);
  // (Presence alone: a rule that reads a missing path fails the execution, where an evaluator tries every rule.)
  const resume = new sfn.Choice(scope, STATE.resumeWait)
    .when(sfn.Condition.isPresent(`${TICKET_PATH}.${FIRST_WAIT_TIMED_OUT}`), branch.pollAgain)
    .when(sfn.Condition.isPresent(`${TICKET_PATH}.${FIRST_WAIT_REFUSED}`), branch.check)
    .otherwise(branch.poll);
  const parallel = new sfn.Parallel(scope, STATE.waitForPermit, {
    parameters: { ...rounds, [TICKET_PATH.slice(2)]: sfn.JsonPath.entirePayload },
    resultPath: sfn.JsonPath.DISCARD,
    outputPath: EXECUTION_INPUT,
  }).branch(resume);
  // A refused ticket leaves its error as the state data (the input need not be an object); a wait that
  // ends other than woken, its error beside its ticket.
  takeTicket.addCatch(parallel, { errors: [CONDITIONAL_CHECK_FAILED], resultPath: '$' });
  waitInQueue.addCatch(parallel, { errors: WAIT_TIMED_OUT, resultPath: `$.${FIRST_WAIT_TIMED_OUT}` });
  waitInQueue.addCatch(parallel, { errors: [...WAIT_REFUSED, ...WAIT_UNCERTAIN], resultPath: `$.${FIRST_WAIT_REFUSED}` });
  return { entry: takeTicket, parallel, firstWait: { takeTicket, waitInQueue } };
}

/**
 * The collector of a weighted waiter of the queue (see lock-schema.ts, COLLECTING): woken with one of its
 * permits, it registers as the lock's one collector, then completes (takes the rest, and its fencing
 * token) once enough are free, looking again every `pollInterval` within the wait's history budget.
 * Refused (another execution collects), it gives its permit back and takes a new ticket.
 *
 *   Register As Collector ─▶ Complete Permits ─refused─▶ Wait To Collect ─▶ (count) ─▶ Complete Permits
 *     │ another collects              │ server error: did it land? Confirm Permits Complete
 *     ▼
 *   Give Up Handed Permit ─▶ (count) ─▶ Take Ticket
 */
function renderCollector(
  scope: Construct,
  table: ISemaphoreTable,
  spec: DefinitionSpec,
  lockTask: LockTaskProps,
  weight: PermitWeight,
  permitPath: string | undefined,
  acquired: <T extends sfn.State & sfn.INextable>(state: T) => T,
  retryRound: sfn.IChainable,
  countRound: (countId: string, checkId: string, events: number, next: sfn.State) => sfn.IChainable,
) {
  const key = { [LOCK_KEY]: lockTask.lockName };
  const holder = lockTask.holder;
  const run = currentRun();
  const one = tasks.DynamoAttributeValue.fromNumber(1);
  const zero = tasks.DynamoAttributeValue.fromNumber(0);
  const retry = transientRetry([...THROTTLING_ERRORS, ...SERVER_ERRORS]);

  const confirm = acquired(
    fencingTokenTask(scope, STATE.confirmPermitsComplete, { table, lockName: lockTask.lockName, permitPath, weight: weight.permits }),
  );
  const complete = acquired(
    new tasks.DynamoUpdateItem(scope, STATE.completePermits, {
      table: table.table,
      key,
      conditionExpression: COMPLETE_COLLECTOR_CONDITION,
      updateExpression: COMPLETE_COLLECTOR_UPDATE,
      expressionAttributeNames: {
        [NAMES.permits]: PERMITS_IN_USE,
        [NAMES.holder]: holder,
        [NAMES.fence]: FENCING_TOKEN,
        [NAMES.collecting]: COLLECTING,
        [NAMES.collectGate]: COLLECT_GATE,
      },
      expressionAttributeValues: {
        [VALUES.extra]: weight.extra,
        [VALUES.weight]: weight.permits,
        [VALUES.one]: one,
        [VALUES.redriveCount]: run,
      },
      ...(permitPath
        ? { returnValues: tasks.DynamoReturnValues.UPDATED_NEW, resultSelector: fencingTokenSelector(), resultPath: permitPath }
        : { resultPath: sfn.JsonPath.DISCARD }),
    }),
  )
    // A retry after a write that landed would be refused for good (the marks are gone): confirm instead.
    .addRetry(transientRetry(THROTTLING_ERRORS))
    .addCatch(confirm, { errors: SERVER_ERRORS, resultPath: sfn.JsonPath.DISCARD });
  const waitToCollect = new sfn.Wait(scope, STATE.waitToCollect, { time: sfn.WaitTime.duration(spec.pollInterval) }).next(
    countRound(STATE.countCollectRound, STATE.collectWithinBudget, COLLECT_ROUND_EVENTS, complete),
  );
  complete.addCatch(waitToCollect, { errors: [CONDITIONAL_CHECK_FAILED], resultPath: sfn.JsonPath.DISCARD });
  // Its entry is gone (see COMPLETE_COLLECTOR_CONDITION): queue again.
  complete.addCatch(retryRound, { errors: [VALIDATION_ERROR], resultPath: sfn.JsonPath.DISCARD });
  confirm.addCatch(waitToCollect, { errors: [CONDITIONAL_CHECK_FAILED], resultPath: sfn.JsonPath.DISCARD });

  // Another execution collects: give the permit back (it goes to that collector, or to the queue) and queue again.
  const giveUp = new tasks.DynamoUpdateItem(scope, STATE.giveUpHandedPermit, {
    table: table.table,
    key,
    conditionExpression: GIVE_UP_HANDED_CONDITION,
    updateExpression: RELEASE_UPDATE,
    expressionAttributeNames: {
      [NAMES.permits]: PERMITS_IN_USE,
      [NAMES.holder]: holder,
      [NAMES.collecting]: COLLECTING,
      [NAMES.bodies]: BODIES_RUNNING,
    },
    expressionAttributeValues: { [VALUES.one]: one, [VALUES.zero]: zero, [VALUES.redriveCount]: run },
    resultPath: sfn.JsonPath.DISCARD,
  })
    .addRetry(retry)
    .addCatch(retryRound, { errors: [CONDITIONAL_CHECK_FAILED], resultPath: sfn.JsonPath.DISCARD })
    .next(retryRound);

  const register = new tasks.DynamoUpdateItem(scope, STATE.registerCollector, {
    table: table.table,
    key,
    conditionExpression: REGISTER_COLLECTOR_CONDITION,
    updateExpression: REGISTER_COLLECTOR_UPDATE,
    expressionAttributeNames: { [NAMES.holder]: holder, [NAMES.collecting]: COLLECTING, [NAMES.collectGate]: COLLECT_GATE },
    expressionAttributeValues: { [VALUES.zero]: zero, [VALUES.one]: one, [VALUES.gate]: weight.collectGate, ...claimStampValues() },
    resultPath: sfn.JsonPath.DISCARD,
  })
    .addRetry(retry)
    .addCatch(giveUp, { errors: [CONDITIONAL_CHECK_FAILED], resultPath: sfn.JsonPath.DISCARD })
    .next(complete);

  /**
   * Found its own entry without being woken: an entry of one permit (handed to it: claim it and
   * collect), else one of all its permits (its own acquire landed late: claim it and go), else none
   * (`otherwise`).
   */
  const claimHanded = (handedId: string, allId: string, otherwise: sfn.IChainable): sfn.TaskStateBase => {
    const all = acquired(fencingTokenTask(scope, allId, { table, lockName: lockTask.lockName, permitPath, weight: weight.permits }));
    all.addCatch(otherwise, { errors: [CONDITIONAL_CHECK_FAILED], resultPath: sfn.JsonPath.DISCARD });
    const handed = fencingTokenTask(scope, handedId, { table, lockName: lockTask.lockName, condition: CLAIM_HANDED_CONDITION })
      .addCatch(all, { errors: [CONDITIONAL_CHECK_FAILED], resultPath: sfn.JsonPath.DISCARD });
    handed.next(register);
    return handed;
  };
  return { register, claimHanded };
}

/**
 * The polling wait, a Parallel whose result is discarded:
 *
 *   Draw Poll Delay → Wait Before First Poll → Poll For Permit ⇄ Wait Before Next Poll
 *
 * Every round waits `pollInterval`, so the acquire timer bounds the rounds; polling always has one
 * (by default the longest wait the history budget holds).
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
  weight: PermitWeight | undefined,
): sfn.Parallel {
  const waitForPermit = new sfn.Parallel(scope, STATE.waitForPermit, { resultPath: sfn.JsonPath.DISCARD });

  const nextWait = new sfn.Wait(scope, STATE.nextWait, { time: sfn.WaitTime.duration(spec.pollInterval) });
  // A poll refused on the execution's own entry (a permit its stopped run took, or a write whose
  // response was lost) claims it, rather than poll beside it until the execution times out.
  const claimOwn = fencingTokenTask(scope, STATE.claimOwnPermitWhilePolling, { table: table, lockName: lockTask.lockName, weight: weight?.permits })
    .addCatch(nextWait, { errors: [CONDITIONAL_CHECK_FAILED], resultPath: sfn.JsonPath.DISCARD });
  // Server errors are retried: a write that landed makes the retry find the execution's own entry.
  const poll = acquireTask(scope, STATE.poll, {
    ...lockTask,
    limit,
    leaseSeconds: spec.leaseSeconds,
    rateIntervalSeconds: spec.holdSeconds,
    weight,
    bodyLimit: spec.bodyLimit,
  })
    .addRetry(transientRetry([...THROTTLING_ERRORS, ...SERVER_ERRORS]))
    .addCatch(nextWait, { errors: [CONDITIONAL_CHECK_FAILED], resultPath: sfn.JsonPath.DISCARD })
    .addCatch(claimOwn, { errors: [VALIDATION_ERROR], resultPath: sfn.JsonPath.DISCARD });
  nextWait.next(poll);

  // Full jitter on the first wait spreads executions that started together over the interval.
  // States.MathRandom's end is exclusive, so this draws 1..pollInterval.
  const drawDelay = new sfn.Pass(scope, STATE.drawPollDelay, {
    parameters: { delaySeconds: sfn.JsonPath.mathRandom(1, (spec.pollSeconds ?? 1) + 1), ...stripeInBranch(spec) },
  });
  const firstWait = new sfn.Wait(scope, STATE.firstWait, { time: sfn.WaitTime.secondsPath('$.delaySeconds') });
  const polling = sfn.Chain.start(drawDelay).next(firstWait).next(poll);

  const acquireTimeout = spec.acquireTimeout;
  if (acquireTimeout === undefined) {
    throw new Error('the polling wait needs its timer (ConcurrencyControlledWorkflow gives it the longest wait by default)');
  }
  const acquired = new sfn.Fail(scope, STATE.permitAcquired, {
    error: PERMIT_ACQUIRED,
    cause: 'Not an error: ends the Parallel early so that the body can start',
  });
  poll.next(acquired);
  claimOwn.next(acquired);
  const timer = new sfn.Wait(scope, STATE.acquireTimer, { time: sfn.WaitTime.duration(acquireTimeout) }).next(
    new sfn.Fail(scope, STATE.acquireTimedOut, {
      error: ACQUIRE_TIMEOUT_ERROR,
      cause: `No permit became free within the acquire timeout of ${acquireTimeout.toHumanString()}`,
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

/** ConcurrencyControlledWorkflow.INVALID_LIMIT_ERROR: a limit from the input that is not a number from 1 to MAX_CONCURRENCY_LIMIT. */
export const INVALID_LIMIT_ERROR = 'SemaphoreInvalidLimit';

/** ConcurrencyControlledWorkflow.INVALID_PERMITS_ERROR: `permits` from the input that is not a number from 1 to the limit. */
export const INVALID_PERMITS_ERROR = 'SemaphoreInvalidPermits';

/** ConcurrencyControlledWorkflow.INVALID_LOCK_NAME_ERROR: a lock name from the input that is missing, empty or has U+001F. */
export const INVALID_LOCK_NAME_ERROR = 'SemaphoreInvalidLockName';

/** Where the queue's branch counts the history events its rounds spent: `{ events }`. */
const WAIT_EVENTS_PATH = '$.semaphoreWait';

/** Marker error that ends the "Wait For Permit" Parallel once the polling branch holds a permit. */
const PERMIT_ACQUIRED = 'SemaphorePermitAcquired';

/** Split, where the state data keeps the stripe's name. */
const STRIPED_LOCK_PATH = `$.${LOCK_STRIPE_FIELD}.name`;
/** Split, where the release after a failure keeps the error, beside its holder and run (at HANDOFF_PATH). */
const STRIPED_ERROR_FIELD = 'error';

/**
 * A split lock's first state (after the idempotency's, if any): draw the stripe, `<lock name>#<n>` with n
 * from 0 to `stripes` - 1, and keep it in the state data at STRIPED_LOCK_PATH. Without idempotency the input
 * waits at HANDOFF_PATH until the body (which receives the input as it came; its output then takes the
 * input's place); with it, the state data is an object already, the payload in it. Every state after it reads the stripe there;
 * the cleanup, which cannot, reads every stripe, and the redrive guard reads it from this state's output
 * in the execution's history. A redrive resumes with the state data, so with the same stripe. A failure
 * puts its error in the input's place, so that the input and an error's cause never fill the state data together.
 * `States.MathRandom` excludes its end ("between the start number (inclusive) and end number (exclusive)").
 */
function pickLockStripe(scope: Construct, lockNameText: string, stripes: number, idempotent: boolean): sfn.Pass {
  const stripe = { name: sfn.JsonPath.format(`{}${LOCK_STRIPE_SEPARATOR}{}`, lockNameText, sfn.JsonPath.mathRandom(0, stripes)) };
  return idempotent
    ? new sfn.Pass(scope, STATE.pickLockStripe, { parameters: stripe, resultPath: `$.${LOCK_STRIPE_FIELD}` })
    : new sfn.Pass(scope, STATE.pickLockStripe, { parameters: { [HANDOFF_PATH.slice(2)]: sfn.JsonPath.objectAt('$'), [LOCK_STRIPE_FIELD]: stripe } });
}

/** Split, the stripe in a wait's own state data (its Parallel's Parameters, or a Pass that replaces it). */
function stripeInBranch(spec: DefinitionSpec): Record<string, unknown> {
  return spec.lockStripes !== undefined && spec.lockStripes > 1 ? { [LOCK_STRIPE_FIELD]: sfn.JsonPath.objectAt(`$.${LOCK_STRIPE_FIELD}`) } : {};
}

/** What the workflow's definition is rendered from: the props, validated and resolved. */
export interface DefinitionSpec {
  readonly body: sfn.IChainable;
  readonly lockName: RuntimeValue<string>;
  readonly limit: RuntimeValue<number>;
  readonly pollInterval: Duration;
  readonly pollSeconds?: number;
  readonly acquireTimeout?: Duration;
  /** The history events the wait may spend (its rounds count them, see history-budget.ts). */
  readonly waitEvents: number;
  readonly leaseSeconds?: number;
  readonly idempotency?: IdempotencyStates;
  readonly waitStrategy: WaitStrategy;
  readonly queueCheckInterval: Duration;
  readonly permitPath?: string;
  /** Under a rate limit: the rate's interval, for which every start of the body holds the permit. */
  readonly holdSeconds?: number;
  /**
   * Under a rate without a concurrency limit: the permit is given back once the interval has passed
   * since the body started, while the body may still run, rather than after both. @default false
   */
  readonly releaseAtInterval?: boolean;
  /** How many permits an acquisition takes. @default - one */
  readonly permits?: RuntimeValue<number>;
  /**
   * Under a rate whose count is above the concurrency limit: how many bodies may run at once (each
   * takes a body slot beside its permit, see BODIES_RUNNING). @default - no body slot
   */
  readonly bodyLimit?: number;
  /** How many tries a wait for a body slot may make (its history budget; see slotWaitPacing). @default - none: no body slot */
  readonly bodySlotRounds?: number;
  /**
   * How many locks (stripes) of `limit` permits each the lock is split into: each execution draws one
   * at random (`<lock name>#<0 to lockStripes - 1>`) and keeps it in its state data (STRIPED_LOCK_PATH).
   * @default - one lock, not split
   */
  readonly lockStripes?: number;
}

/** The body slot's way in: its first take, and the wait (a Parallel retried from `pollInterval`, backing off) after a refusal. */
interface BodySlotGate {
  readonly take: sfn.TaskStateBase;
  readonly wait: sfn.Parallel;
}

/**
 * Take a body slot (TAKE_BODY_SLOT) before the body; it draws the body's fencing token. Refused, the
 * execution waits in a Parallel whose every try first claims a slot it may hold already (a take whose
 * response was lost, a redrive: BODY_SLOT_HELD), then takes one; a try that finds them all taken fails
 * with SemaphoreAcquireTimeout, which the Parallel's Retry turns into the next round after
 * `pollInterval`, backing off (slotWaitPacing), up to the history budget (the rounds keep no count in
 * the state data, which the body would see). Past it, the error stands: the execution gives back its
 * permit and fails. A missing entry (ValidationException) is the caller's to catch: it acquires again.
 */
function bodySlotGate(
  scope: Construct,
  table: ISemaphoreTable,
  lockName: tasks.DynamoAttributeValue,
  spec: DefinitionSpec,
  permitPath: string | undefined,
  releaseAfterFailure: sfn.State,
  errorPath: string,
): BodySlotGate {
  const slotTask = (id: string) =>
    new tasks.DynamoUpdateItem(scope, id, {
      table: table.table,
      key: { [LOCK_KEY]: lockName },
      conditionExpression: TAKE_BODY_SLOT_CONDITION,
      updateExpression: TAKE_BODY_SLOT_UPDATE,
      expressionAttributeNames: {
        [NAMES.holder]: ownHolderKey(),
        [NAMES.fence]: FENCING_TOKEN,
        [NAMES.bodies]: BODIES_RUNNING,
        [NAMES.bodyLimit]: BODY_LIMIT,
      },
      expressionAttributeValues: {
        [VALUES.zero]: tasks.DynamoAttributeValue.fromNumber(0),
        [VALUES.one]: tasks.DynamoAttributeValue.fromNumber(1),
        [VALUES.bodyLimit]: tasks.DynamoAttributeValue.fromNumber(spec.bodyLimit!),
        ...claimStampValues(),
      },
      ...(permitPath
        ? { returnValues: tasks.DynamoReturnValues.UPDATED_NEW, resultSelector: fencingTokenSelector(), resultPath: permitPath }
        : { resultPath: sfn.JsonPath.DISCARD }),
    }).addRetry(transientRetry(THROTTLING_ERRORS));
  // A slot is held for a whole body: the tries back off to a minute apart, so that the budget lasts hours.
  const pacing = slotWaitPacing(spec.pollInterval.toSeconds());
  const rounds = spec.bodySlotRounds!;
  const backsOff = pacing.backoffRate > 1;
  const taken = new sfn.Fail(scope, STATE.bodySlotsTaken, {
    error: ACQUIRE_TIMEOUT_ERROR,
    cause: backsOff
      ? `Every body slot of the lock (concurrencyLimit ${spec.bodyLimit}) stayed taken for ${rounds} tries over ` +
        `${Duration.seconds(Math.round(slotWaitSeconds(pacing, rounds))).toHumanString()}, the first after ${spec.pollInterval.toHumanString()}, ` +
        `then ${pacing.backoffRate} times longer each, up to ${Duration.seconds(pacing.maxDelaySeconds).toHumanString()}`
      : `Every body slot of the lock (concurrencyLimit ${spec.bodyLimit}) stayed taken for ${rounds} tries, one every ${spec.pollInterval.toHumanString()}`,
  });
  const refused = { errors: [CONDITIONAL_CHECK_FAILED, ...SERVER_ERRORS], resultPath: sfn.JsonPath.DISCARD };
  const takeAgain = slotTask(STATE.takeBodySlotAgain).addCatch(taken, refused);
  const check = fencingTokenTask(scope, STATE.checkBodySlot, { table, lockName, permitPath, condition: BODY_SLOT_HELD_CONDITION });
  check.addCatch(takeAgain, { errors: [CONDITIONAL_CHECK_FAILED], resultPath: sfn.JsonPath.DISCARD });
  // The branch's fencing token (at the permit path) is the Parallel's result.
  const wait = new sfn.Parallel(scope, STATE.waitForBodySlot, {
    ...(permitPath
      ? { resultSelector: { fencingToken: sfn.JsonPath.numberAt(`$[0]${permitPath.slice(1)}.fencingToken`) }, resultPath: permitPath }
      : { resultPath: sfn.JsonPath.DISCARD }),
  })
    .branch(check)
    .addRetry({
      errors: [ACQUIRE_TIMEOUT_ERROR],
      interval: spec.pollInterval,
      maxAttempts: rounds,
      backoffRate: pacing.backoffRate,
      ...(backsOff ? { maxDelay: Duration.seconds(pacing.maxDelaySeconds) } : {}),
    });
  wait.addCatch(releaseAfterFailure, { errors: [ACQUIRE_TIMEOUT_ERROR], resultPath: errorPath });
  const take = slotTask(STATE.takeBodySlot).addCatch(wait, refused);
  return { take, wait };
}

/**
 * Give back the body slot (RELEASE_BODY_SLOT), keeping the permit. Refused (`refusals`), the slot was
 * given back already, or never taken: the Pass `releasedId` goes on instead. The caller chains both.
 * With `keepSlot`, an entry that gave its permit back at the interval goes with its slot, first
 * (RELEASE_BODY_SLOT_AND_ENTRY, then the Pass); refused, the entry holds its permit, and the slot alone goes.
 */
function releaseBodySlot(
  scope: Construct,
  table: ISemaphoreTable,
  lockName: tasks.DynamoAttributeValue,
  ids: { release: string; released: string; andEntry: string },
  refusals: string[],
  keepSlot: boolean,
): { first: sfn.TaskStateBase; release: sfn.TaskStateBase; released: sfn.Pass } {
  const released = new sfn.Pass(scope, ids.released);
  const release = new tasks.DynamoUpdateItem(scope, ids.release, {
    table: table.table,
    key: { [LOCK_KEY]: lockName },
    conditionExpression: RELEASE_BODY_SLOT_CONDITION,
    updateExpression: RELEASE_BODY_SLOT_UPDATE,
    expressionAttributeNames: { [NAMES.holder]: ownHolderKey(), [NAMES.bodies]: BODIES_RUNNING },
    expressionAttributeValues: { [VALUES.one]: tasks.DynamoAttributeValue.fromNumber(1) },
    resultPath: sfn.JsonPath.DISCARD,
  })
    .addRetry(transientRetry([...THROTTLING_ERRORS, ...SERVER_ERRORS]))
    .addCatch(released, { errors: refusals, resultPath: sfn.JsonPath.DISCARD });
  if (!keepSlot) return { first: release, release, released };
  const andEntry = new tasks.DynamoUpdateItem(scope, ids.andEntry, {
    table: table.table,
    key: { [LOCK_KEY]: lockName },
    conditionExpression: RELEASE_BODY_SLOT_AND_ENTRY_CONDITION,
    updateExpression: RELEASE_BODY_SLOT_AND_ENTRY_UPDATE,
    expressionAttributeNames: { [NAMES.holder]: ownHolderKey(), [NAMES.bodies]: BODIES_RUNNING },
    expressionAttributeValues: { [VALUES.zero]: tasks.DynamoAttributeValue.fromNumber(0), [VALUES.one]: tasks.DynamoAttributeValue.fromNumber(1) },
    resultPath: sfn.JsonPath.DISCARD,
  })
    .addRetry(transientRetry([...THROTTLING_ERRORS, ...SERVER_ERRORS]))
    // Refused, the entry holds its permit (or is gone): the slot alone. The other `refusals` go the
    // same way, which then tells.
    .addCatch(release, { errors: refusals, resultPath: sfn.JsonPath.DISCARD });
  andEntry.next(released);
  return { first: andEntry, release, released };
}

/**
 * The body of a workflow with a body slot: inside a Parallel of its own (so that a `Succeed` in it
 * cannot skip what follows), then the slot goes back while the permit stays held for the rest of the
 * rate's interval by the other branch. With `keepSlot` (a concurrency limit above the rate's count),
 * the other branch gives the permit back at the interval and the slot goes after both (renderDefinition).
 */
function bodyInSlot(
  scope: Construct,
  table: ISemaphoreTable,
  lockName: tasks.DynamoAttributeValue,
  body: sfn.IChainable,
  keepSlot: boolean,
): sfn.IChainable {
  const ids = { release: STATE.releaseBodySlot, released: STATE.bodySlotReleased, andEntry: STATE.releaseBodySlotAndEntry };
  // The Parallel wraps the body's output in an array: `$[0]` unwraps it.
  const inSlot = new sfn.Parallel(scope, STATE.runBodyInSlot, { outputPath: '$[0]' }).branch(body);
  // Beside a release at the interval that keeps the slot, the slot goes after the outer Parallel.
  if (keepSlot) return inSlot;
  const { release, released } = releaseBodySlot(scope, table, lockName, ids, [CONDITIONAL_CHECK_FAILED], false);
  release.next(released);
  return inSlot.next(release);
}

function seconds(n: number): sfn.WaitTime {
  return sfn.WaitTime.duration(Duration.seconds(n));
}
