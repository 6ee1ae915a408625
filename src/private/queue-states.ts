import { Duration, Stack, ArnFormat, Token } from 'aws-cdk-lib';
import * as sfn from 'aws-cdk-lib/aws-stepfunctions';
import * as tasks from 'aws-cdk-lib/aws-stepfunctions-tasks';
import { Construct } from 'constructs';
import { CONDITIONAL_CHECK_FAILED, SERVER_ERRORS, THROTTLING_ERRORS, transientRetry, VALIDATION_ERROR } from './dynamodb-errors';
import {
  CLAIM_CONDITION,
  CLAIM_UPDATE,
  CONFIRM_HAND_OFF_CONDITION,
  CONCURRENCY_LIMIT,
  CONFIRM_HAND_OFF_UPDATE,
  DROP_HEAD_CONDITION,
  DROP_HEAD_UPDATE,
  ENQUEUE_CONDITION,
  ENQUEUE_UPDATE,
  FENCING_TOKEN,
  HAND_OFF_CONDITION,
  HAND_OFF_UPDATE,
  HOLDER_ACQUIRED_AT,
  HOLDER_HANDOFF_ID,
  HOLDER_LEASE_SECONDS,
  HOLDER_REDRIVE_COUNT,
  LOCK_KEY,
  MAX_WAITERS,
  NAMES,
  NEXT_WAITER,
  PEEK_CONDITION,
  PEEK_UPDATE,
  PERMITS_IN_USE,
  QUEUE_NAMES,
  QUEUE_VALUES,
  RELEASE_IF_NO_WAITERS_CONDITION,
  RELEASE_UPDATE,
  RENEW_WAIT_CONDITION,
  RENEW_WAIT_UPDATE,
  STILL_HELD_CONDITION,
  STILL_HELD_UPDATE,
  TAKE_BACK_CONDITION,
  TAKE_BACK_UPDATE,
  VALUES,
  WAIT_TOKEN_FORMAT,
  WAITER_ID,
  WAITERS,
} from './lock-schema';
import { fencingTokenSelector, waitTokenName } from './lock-tasks';
import { STATE } from './state-names';
import { ISemaphoreTable } from '../semaphore-table';

/*
 * The states of the queue wait strategy: a waiter that sleeps in a `.waitForTaskToken` task, and the
 * release that hands a permit to the oldest waiter and wakes it. See lock-schema.ts for the item.
 *
 * Waiter:   Acquire Permit ─full─▶ Wait In Queue ──woken──▶ (body)
 *                                    │ timed out: was the wake-up lost?
 *                                    ▼
 *                                  Check Handed-Off Permit ─no─▶ Poll For Permit ─full─▶ Wait In Queue Again (same place, new token)
 *
 * Release:  Release Permit (only if nobody waits) ─waiters─▶ Peek At Next Waiter ─▶ Hand Off Permit ─▶ Wake Next Waiter
 *           Peek finds no waiter (served meanwhile) ─▶ Release Permit Without Hand-Off (only if nobody
 *           waits) ─waiters again─▶ Is Permit Still Held ─yes─▶ Peek At Next Waiter; no ─▶ done.
 *           A waiter that cannot be woken (its token is closed: it stopped, or its wait timed out
 *           just then) gets its permit taken back and passed on, by the same states.
 */

/** DynamoDB errors of the AWS SDK integration (`DynamoDb.` prefix), which the enqueue task uses. */
const SDK_CONDITIONAL_CHECK_FAILED = 'DynamoDb.ConditionalCheckFailedException';
const SDK_THROTTLING_ERRORS = THROTTLING_ERRORS.map((e) => e.replace(/^DynamoDB\./, 'DynamoDb.'));
const SDK_SERVER_ERRORS = SERVER_ERRORS.map((e) => e.replace(/^DynamoDB\./, 'DynamoDb.'));

/**
 * Errors of SendTaskSuccess with a token whose task no longer waits (AWS SDK integration names,
 * `Sfn.<Exception>`): TaskTimedOut for a closed token, TaskDoesNotExist, InvalidToken.
 * @see https://docs.aws.amazon.com/step-functions/latest/apireference/API_SendTaskSuccess.html
 */
export const TOKEN_GONE_ERRORS = ['Sfn.TaskTimedOutException', 'Sfn.TaskDoesNotExistException', 'Sfn.InvalidTokenException'];

/** Where the release states keep their scratch data (the state data must be an object). */
export const HANDOFF_PATH = '$.handoff';

/** Names of the release states, with a suffix per use ('' for the success path; see state-names.ts). */
export function releaseStateNames(suffix: string) {
  return {
    release: `${STATE.release}${suffix}`,
    releaseWithoutHandOff: `${STATE.releaseWithoutHandOff}${suffix}`,
    peek: `${STATE.peekAtNextWaiter}${suffix}`,
    handOff: `${STATE.handOff}${suffix}`,
    dropHead: `${STATE.dropServedWaiter}${suffix}`,
    wake: `${STATE.wakeNextWaiter}${suffix}`,
    takeBack: `${STATE.takeBackPermit}${suffix}`,
    confirmHandOff: `${STATE.confirmHandOff}${suffix}`,
    wakeUpLost: `${STATE.wakeUpLost}${suffix}`,
    stillHeld: `${STATE.stillHeld}${suffix}`,
    alreadyReleased: `${STATE.alreadyReleased}${suffix}`,
  };
}

export interface HandOffProps {
  readonly table: ISemaphoreTable;
  readonly lockName: tasks.DynamoAttributeValue;
  /** Appended to every state name, so that several uses fit in one state machine. */
  readonly suffix: string;
  /**
   * Where the chain goes when the permit is given back or handed off. @default - it ends the
   * execution, with `outputPath`
   */
  readonly next?: sfn.IChainable;
  /** Output of the execution when the chain ends it. @default '$' */
  readonly outputPath?: string;
  /** Where the chain goes when the holder held no permit (any more). @default - `next`, else a Succeed state of its own */
  readonly alreadyReleased?: sfn.IChainable;
}

/**
 * The release of the queue strategy, for the holder at `$.handoff.holder` (run `$.handoff.redriveCount`).
 *
 * Nobody waiting, it is one conditional write, as without a queue. With waiters, it reads the head,
 * moves the holder entry to it (drawing its fencing token in the same write), and wakes it: three
 * writes and a call.
 */
export function handOffChain(scope: Construct, props: HandOffProps): sfn.State {
  const names = releaseStateNames(props.suffix);
  const table = props.table.table;
  const holder = sfn.JsonPath.stringAt(`${HANDOFF_PATH}.holder`);
  const redriveCount = tasks.DynamoAttributeValue.numberFromString(sfn.JsonPath.jsonToString(sfn.JsonPath.objectAt(`${HANDOFF_PATH}.redriveCount`)));
  const key = { [LOCK_KEY]: props.lockName };
  const retry = transientRetry([...THROTTLING_ERRORS, ...SERVER_ERRORS]);
  const end = <T extends sfn.INextable & sfn.State>(state: T): T => {
    if (props.next) state.next(props.next);
    return state;
  };
  const endProps = props.next ? {} : { outputPath: props.outputPath };

  const alreadyReleased = props.alreadyReleased ?? props.next ?? new sfn.Succeed(scope, names.alreadyReleased, { outputPath: props.outputPath });

  // Give the permit back if nobody waits: the release's first write, and again after a peek found no
  // waiter, since a waiter can enqueue between the two writes (the lock was full) and would then sleep
  // beside a free permit.
  const giveBack = (id: string) =>
    end(
      new tasks.DynamoUpdateItem(scope, id, {
        table,
        key,
        conditionExpression: RELEASE_IF_NO_WAITERS_CONDITION,
        updateExpression: RELEASE_UPDATE,
        expressionAttributeNames: { [NAMES.permits]: PERMITS_IN_USE, [NAMES.holder]: holder, [QUEUE_NAMES.waiters]: WAITERS },
        expressionAttributeValues: {
          [VALUES.one]: tasks.DynamoAttributeValue.fromNumber(1),
          [VALUES.zero]: tasks.DynamoAttributeValue.fromNumber(0),
          [VALUES.redriveCount]: redriveCount,
        },
        resultPath: sfn.JsonPath.DISCARD,
        ...endProps,
      }).addRetry(retry),
    );
  const releaseWithoutHandOff = giveBack(names.releaseWithoutHandOff);
  // Refused: not held (any more), or a waiter came. Which? A no-op write conditional on the holder.
  const stillHeld = new tasks.DynamoUpdateItem(scope, names.stillHeld, {
    table,
    key,
    conditionExpression: STILL_HELD_CONDITION,
    updateExpression: STILL_HELD_UPDATE,
    expressionAttributeNames: { [NAMES.permits]: PERMITS_IN_USE, [NAMES.holder]: holder },
    expressionAttributeValues: { [VALUES.redriveCount]: redriveCount },
    resultPath: sfn.JsonPath.DISCARD,
  })
    .addRetry(retry)
    .addCatch(alreadyReleased, { errors: [CONDITIONAL_CHECK_FAILED], resultPath: sfn.JsonPath.DISCARD });
  releaseWithoutHandOff.addCatch(stillHeld, { errors: [CONDITIONAL_CHECK_FAILED], resultPath: sfn.JsonPath.DISCARD });

  const release = giveBack(names.release);

  // The head as strings (DynamoDB numbers are strings), and an id for the hand-off to it.
  const next = `$.Attributes.${NEXT_WAITER}.M`;
  const peek = new tasks.DynamoUpdateItem(scope, names.peek, {
    table,
    key,
    conditionExpression: PEEK_CONDITION,
    updateExpression: PEEK_UPDATE,
    expressionAttributeNames: {
      [NAMES.holder]: holder,
      [QUEUE_NAMES.waiters]: WAITERS,
      [QUEUE_NAMES.next]: NEXT_WAITER,
    },
    expressionAttributeValues: {
      [VALUES.zero]: tasks.DynamoAttributeValue.fromNumber(0),
      [VALUES.redriveCount]: redriveCount,
    },
    returnValues: tasks.DynamoReturnValues.UPDATED_NEW,
    resultSelector: {
      id: sfn.JsonPath.stringAt(`${next}.${WAITER_ID}.S`),
      redriveCount: sfn.JsonPath.stringAt(`${next}.${HOLDER_REDRIVE_COUNT}.N`),
      leaseSeconds: sfn.JsonPath.stringAt(`${next}.${HOLDER_LEASE_SECONDS}.N`),
      handoffId: sfn.JsonPath.uuid(),
    },
    resultPath: `${HANDOFF_PATH}.next`,
  })
    .addRetry(retry)
    // No permit to hand (released by someone else), or no waiter left (served by another releaser).
    .addCatch(releaseWithoutHandOff, { errors: [CONDITIONAL_CHECK_FAILED], resultPath: sfn.JsonPath.DISCARD });
  release.addCatch(peek, { errors: [CONDITIONAL_CHECK_FAILED], resultPath: sfn.JsonPath.DISCARD });
  stillHeld.next(peek);

  const headId = sfn.JsonPath.stringAt(`${HANDOFF_PATH}.next.id`);
  // The head's wait token is named by its run and ARN, as the entry read from the queue has them.
  const headToken = sfn.JsonPath.format(WAIT_TOKEN_FORMAT, sfn.JsonPath.stringAt(`${HANDOFF_PATH}.next.redriveCount`), headId);
  // After the head was served by another releaser the queue most likely holds more: peek again at
  // once (an empty queue sends the peek on to Release Permit Without Hand-Off), one write fewer than
  // starting over with Release Permit, which would be refused.
  const dropHead = new tasks.DynamoUpdateItem(scope, names.dropHead, {
    table,
    key,
    conditionExpression: DROP_HEAD_CONDITION,
    updateExpression: DROP_HEAD_UPDATE,
    expressionAttributeNames: { [QUEUE_NAMES.waiters]: WAITERS, [QUEUE_NAMES.head]: headId, [QUEUE_NAMES.headToken]: headToken },
    expressionAttributeValues: { [QUEUE_VALUES.headId]: tasks.DynamoAttributeValue.fromString(headId) },
    resultPath: sfn.JsonPath.DISCARD,
  })
    .addRetry(retry)
    .addCatch(peek, { errors: [CONDITIONAL_CHECK_FAILED], resultPath: sfn.JsonPath.DISCARD })
    .next(peek);

  // The hand-off's id, with the run that uses it: a run redriven after the hand-off neither confirms
  // nor takes back a hand-off of the run before (its wake-up may have been delivered: the waiter uses
  // the permit). Such a permit is freed by the waiter, its cleanup or the sweep.
  const handoffId = tasks.DynamoAttributeValue.fromString(
    sfn.JsonPath.format('{}/{}', sfn.JsonPath.stringAt(`${HANDOFF_PATH}.next.handoffId`), sfn.JsonPath.stringAt('$$.Execution.RedriveCount')),
  );
  const handOff = new tasks.DynamoUpdateItem(scope, names.handOff, {
    table,
    key,
    conditionExpression: HAND_OFF_CONDITION,
    updateExpression: HAND_OFF_UPDATE,
    expressionAttributeNames: {
      [NAMES.holder]: holder,
      [QUEUE_NAMES.waiters]: WAITERS,
      [QUEUE_NAMES.head]: headId,
      [QUEUE_NAMES.headToken]: headToken,
      [NAMES.fence]: FENCING_TOKEN,
    },
    expressionAttributeValues: {
      [VALUES.redriveCount]: redriveCount,
      [VALUES.one]: tasks.DynamoAttributeValue.fromNumber(1),
      [QUEUE_VALUES.headId]: tasks.DynamoAttributeValue.fromString(headId),
      [VALUES.entry]: tasks.DynamoAttributeValue.fromMap({
        [HOLDER_ACQUIRED_AT]: tasks.DynamoAttributeValue.fromString(sfn.JsonPath.stringAt('$$.State.EnteredTime')),
        [HOLDER_REDRIVE_COUNT]: tasks.DynamoAttributeValue.numberFromString(sfn.JsonPath.stringAt(`${HANDOFF_PATH}.next.redriveCount`)),
        [HOLDER_LEASE_SECONDS]: tasks.DynamoAttributeValue.numberFromString(sfn.JsonPath.stringAt(`${HANDOFF_PATH}.next.leaseSeconds`)),
        [HOLDER_HANDOFF_ID]: handoffId,
      }),
    },
    // The head's token, removed by this very update (the one string among the old values it returns),
    // and the fencing counter before this update drew the head's token from it.
    returnValues: tasks.DynamoReturnValues.UPDATED_OLD,
    resultSelector: {
      tokens: sfn.JsonPath.listAt('$.Attributes.*.S'),
      wake: { fencingToken: sfn.JsonPath.mathAdd(Token.asNumber(sfn.JsonPath.stringToJson(sfn.JsonPath.stringAt(`$.Attributes.${FENCING_TOKEN}.N`))), 1) },
    },
    resultPath: `${HANDOFF_PATH}.head`,
  })
    // A retry after a write that landed would fail its condition and lose the wake-up: server errors
    // are confirmed instead (below).
    .addRetry(transientRetry(THROTTLING_ERRORS))
    // The head was served by another releaser, or already holds a permit, or ours is gone: look again.
    // The head can be the releaser itself (an entry from before it got its permit by polling): then
    // DynamoDB rejects the update (its two paths overlap) and the entry is dropped the same way.
    .addCatch(dropHead, { errors: [CONDITIONAL_CHECK_FAILED, VALIDATION_ERROR], resultPath: sfn.JsonPath.DISCARD });
  peek.next(handOff);

  // Did the hand-off land? Its id is in the head's entry if and only if it did. If it did,
  // its response (with the head's token) is lost: take the permit back (unless the waiter has claimed
  // it) and hand it on, rather than leave it with a waiter that may have stopped.
  const confirmHandOff = new tasks.DynamoUpdateItem(scope, names.confirmHandOff, {
    table,
    key,
    conditionExpression: CONFIRM_HAND_OFF_CONDITION,
    updateExpression: CONFIRM_HAND_OFF_UPDATE,
    expressionAttributeNames: { [QUEUE_NAMES.head]: headId, [NAMES.fence]: FENCING_TOKEN },
    expressionAttributeValues: { [QUEUE_VALUES.handoffId]: handoffId },
    resultPath: sfn.JsonPath.DISCARD,
  })
    .addRetry(retry)
    .addCatch(release, { errors: [CONDITIONAL_CHECK_FAILED], resultPath: sfn.JsonPath.DISCARD });
  handOff.addCatch(confirmHandOff, { errors: SERVER_ERRORS, resultPath: sfn.JsonPath.DISCARD });

  // The woken waiter's task has gone (the execution stopped, or its wait timed out just then): take
  // the permit back, unless the waiter found and claimed it meanwhile, and hand it on.
  const takeBack = new tasks.DynamoUpdateItem(scope, names.takeBack, {
    table,
    key,
    conditionExpression: TAKE_BACK_CONDITION,
    updateExpression: TAKE_BACK_UPDATE,
    expressionAttributeNames: { [NAMES.holder]: holder, [QUEUE_NAMES.head]: headId },
    expressionAttributeValues: {
      [QUEUE_VALUES.handoffId]: handoffId,
      [VALUES.entry]: tasks.DynamoAttributeValue.fromMap({
        [HOLDER_ACQUIRED_AT]: tasks.DynamoAttributeValue.fromString(sfn.JsonPath.stringAt('$$.State.EnteredTime')),
        [HOLDER_REDRIVE_COUNT]: redriveCount,
      }),
    },
    resultPath: sfn.JsonPath.DISCARD,
  }).addRetry(retry);
  takeBack.next(release);
  // Refused: the waiter claimed the permit, or it is gone with it, or a retry finds that the take-back
  // landed already. Only in that last case is there still a permit to give back, which the release
  // finds out by itself.
  takeBack.addCatch(release, { errors: [CONDITIONAL_CHECK_FAILED], resultPath: sfn.JsonPath.DISCARD });

  const wakeUpLost = props.next ?? new sfn.Succeed(scope, names.wakeUpLost, { outputPath: props.outputPath });
  const wake = end(
    new tasks.CallAwsService(scope, names.wake, {
      service: 'sfn',
      action: 'sendTaskSuccess',
      parameters: {
        TaskToken: sfn.JsonPath.arrayGetItem(sfn.JsonPath.listAt(`${HANDOFF_PATH}.head.tokens`), 0),
        Output: sfn.JsonPath.jsonToString(sfn.JsonPath.objectAt(`${HANDOFF_PATH}.head.wake`)),
      },
      iamAction: 'states:SendTaskSuccess',
      // Waiters of a shared lock can be executions of any workflow using it, in this account and Region.
      iamResources: [Stack.of(scope).formatArn({ service: 'states', resource: 'stateMachine', resourceName: '*', arnFormat: ArnFormat.COLON_RESOURCE_NAME })],
      resultPath: sfn.JsonPath.DISCARD,
      ...endProps,
    })
      // Only throttling is retried: after any other failure the call may have woken the waiter, and a
      // retry would then hear TaskTimedOut and take back the permit the waiter is using.
      .addRetry({ errors: ['Sfn.ThrottlingException'], interval: Duration.seconds(1), backoffRate: 2, maxAttempts: 5, jitterStrategy: sfn.JitterType.FULL })
      .addCatch(takeBack, { errors: TOKEN_GONE_ERRORS, resultPath: sfn.JsonPath.DISCARD })
      // Any other failure is a lost wake-up: the waiter finds its permit when its wait times out.
      .addCatch(wakeUpLost, { errors: [sfn.Errors.ALL], resultPath: sfn.JsonPath.DISCARD }),
  );
  handOff.next(wake);
  confirmHandOff.next(takeBack);
  return release;
}

export interface WaiterProps {
  readonly table: ISemaphoreTable;
  readonly lockName: tasks.DynamoAttributeValue;
  readonly limit: tasks.DynamoAttributeValue;
  /** Lease of the workflow, seconds (0: none): the holder entry a hand-off writes carries it. */
  readonly leaseSeconds: number;
  /** How long a waiter sleeps before it checks whether its wake-up was lost. */
  readonly checkInterval: Duration;
  /** Where the wake-up's `{ fencingToken }` goes. @default - discarded */
  readonly permitPath?: string;
}

/**
 * "Wait In Queue": append this execution to the queue, atomically with "the lock is still full", and
 * sleep until a releaser hands it a permit. Its output is `{ fencingToken }`.
 */
export function waitInQueueTask(scope: Construct, props: WaiterProps): sfn.TaskStateBase {
  return waitTask(scope, STATE.waitInQueue, props, ENQUEUE_UPDATE, ENQUEUE_CONDITION);
}

/**
 * "Wait In Queue Again": after a wait timed out, sleep again in the same place: a new token for the
 * entry the execution still has. Its condition is the timed-out waiter's whole check: refused when a
 * permit was handed to it (the wake-up was lost), a permit is free, or its entry is gone. So a long
 * wait costs one transition and one write per `queueCheckInterval`.
 */
export function renewWaitTask(scope: Construct, props: WaiterProps): sfn.TaskStateBase {
  return waitTask(scope, STATE.waitInQueueAgain, props, RENEW_WAIT_UPDATE, RENEW_WAIT_CONDITION);
}

function waitTask(scope: Construct, id: string, props: WaiterProps, update: string, condition: string): sfn.TaskStateBase {
  const limit = props.limit.toObject();
  const enqueue = update === ENQUEUE_UPDATE;
  return new tasks.CallAwsService(scope, id, {
    service: 'dynamodb',
    action: 'updateItem',
    integrationPattern: sfn.IntegrationPattern.WAIT_FOR_TASK_TOKEN,
    parameters: {
      TableName: props.table.table.tableName,
      Key: { [LOCK_KEY]: props.lockName.toObject() },
      UpdateExpression: update,
      ConditionExpression: condition,
      ExpressionAttributeNames: {
        [NAMES.permits]: PERMITS_IN_USE,
        [NAMES.holder]: sfn.JsonPath.stringAt('$$.Execution.Id'),
        [QUEUE_NAMES.token]: waitTokenName(),
        ...(enqueue ? { [QUEUE_NAMES.waiters]: WAITERS } : {}),
      },
      ExpressionAttributeValues: {
        [VALUES.limit]: limit,
        [QUEUE_VALUES.token]: { S: sfn.JsonPath.taskToken },
        ...(enqueue
          ? {
            [QUEUE_VALUES.maxWaiters]: { N: String(MAX_WAITERS) },
            [QUEUE_VALUES.emptyList]: { L: [] },
            [QUEUE_VALUES.me]: {
              L: [
                {
                  M: {
                    [WAITER_ID]: { S: sfn.JsonPath.stringAt('$$.Execution.Id') },
                    [HOLDER_REDRIVE_COUNT]: { N: sfn.JsonPath.jsonToString(sfn.JsonPath.objectAt('$$.Execution.RedriveCount')) },
                    [HOLDER_LEASE_SECONDS]: { N: String(props.leaseSeconds) },
                    // Its own limit: the reconciler hands it a free permit only below it.
                    [CONCURRENCY_LIMIT]: limit,
                  },
                },
              ],
            },
          }
          : {}),
      },
    },
    iamAction: 'dynamodb:UpdateItem',
    // As the DynamoDB tasks' own grant, so that the two statements are one.
    iamResources: [Stack.of(scope).formatArn({ service: 'dynamodb', resource: 'table', resourceName: props.table.table.tableName })],
    taskTimeout: sfn.Timeout.duration(props.checkInterval),
    resultPath: props.permitPath ?? sfn.JsonPath.DISCARD,
  }).addRetry(transientRetry(SDK_THROTTLING_ERRORS));
}

/**
 * The wait's errors: refused (the lock is not full any more, the queue is full, the execution holds a
 * permit, or its entry is gone); uncertain (a server error: did the write land?); timed out (no
 * wake-up within `queueCheckInterval`).
 */
export const ENQUEUE_REFUSED = [SDK_CONDITIONAL_CHECK_FAILED];
export const ENQUEUE_UNCERTAIN = SDK_SERVER_ERRORS;
export const WAIT_TIMED_OUT = [sfn.Errors.TIMEOUT];

/**
 * A conditional write that claims this execution's own holder entry for its current run (CLAIM_CONDITION):
 * "Check Handed-Off Permit" after a wait timed out or was refused (was a permit handed over and the
 * wake-up lost?), "Claim Own Permit" after an acquire that found one (taken by an earlier run, or by a
 * write whose response was lost), and "Read Fencing Token" where a permit was taken in a Parallel whose
 * result is discarded. It draws a fresh fencing token.
 */
export function fencingTokenTask(
  scope: Construct,
  id: string,
  props: { table: ISemaphoreTable; lockName: tasks.DynamoAttributeValue; permitPath?: string },
): sfn.TaskStateBase {
  return new tasks.DynamoUpdateItem(scope, id, {
    table: props.table.table,
    key: { [LOCK_KEY]: props.lockName },
    conditionExpression: CLAIM_CONDITION,
    updateExpression: CLAIM_UPDATE,
    expressionAttributeNames: {
      [NAMES.holder]: sfn.JsonPath.stringAt('$$.Execution.Id'),
      [NAMES.fence]: FENCING_TOKEN,
      [QUEUE_NAMES.token]: waitTokenName(),
    },
    expressionAttributeValues: {
      [VALUES.zero]: tasks.DynamoAttributeValue.fromNumber(0),
      [VALUES.one]: tasks.DynamoAttributeValue.fromNumber(1),
      [QUEUE_VALUES.claimed]: tasks.DynamoAttributeValue.fromBoolean(true),
      [VALUES.acquiredAt]: tasks.DynamoAttributeValue.fromString(sfn.JsonPath.stringAt('$$.State.EnteredTime')),
      [VALUES.redriveCount]: tasks.DynamoAttributeValue.numberFromString(sfn.JsonPath.jsonToString(sfn.JsonPath.objectAt('$$.Execution.RedriveCount'))),
    },
    returnValues: props.permitPath ? tasks.DynamoReturnValues.UPDATED_NEW : undefined,
    resultSelector: props.permitPath ? fencingTokenSelector() : undefined,
    resultPath: props.permitPath ?? sfn.JsonPath.DISCARD,
  }).addRetry(transientRetry([...THROTTLING_ERRORS, ...SERVER_ERRORS]));
}
