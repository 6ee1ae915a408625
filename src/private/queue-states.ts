import { Aws, Duration, Stack, Token } from 'aws-cdk-lib';
import * as sfn from 'aws-cdk-lib/aws-stepfunctions';
import * as tasks from 'aws-cdk-lib/aws-stepfunctions-tasks';
import { Construct } from 'constructs';
import { CONDITIONAL_CHECK_FAILED, SERVER_ERRORS, THROTTLING_ERRORS, transientRetry, VALIDATION_ERROR } from './dynamodb-errors';
import {
  BODIES_RUNNING,
  CLAIM_CONDITION,
  CLAIM_UPDATE,
  COLLECT_GATE,
  COLLECTING,
  WEIGHTED_TAKE_TICKET_CONDITION,
  WEIGHTED_CLAIM_CONDITION,
  TAKE_BACK_ONE_CONDITION,
  TAKE_BACK_ONE_UPDATE,
  CONCURRENCY_LIMIT,
  CONFIRM_HAND_OFF_CONDITION,
  CONFIRM_HAND_OFF_UPDATE,
  FENCING_TOKEN,
  HAND_OFF_CONDITION,
  HAND_OFF_UPDATE,
  KEEP_SLOT_HAND_OFF_CONDITION,
  KEEP_SLOT_HAND_OFF_UPDATE,
  KEEP_SLOT_RELEASE_CONDITION,
  KEEP_SLOT_RELEASE_UPDATE,
  OUTSIDE_BODY,
  STILL_HOLDS_PERMIT_CONDITION,
  TAKE_BACK_INTO_SLOT_CONDITION,
  TAKE_BACK_INTO_SLOT_UPDATE,
  HOLDER_ACQUIRED_AT,
  HOLDER_HANDOFF_ID,
  HOLDER_LEASE_SECONDS,
  HOLDER_REDRIVE_COUNT,
  LOCK_KEY,
  NAMES,
  PEEK_CONDITION,
  PEEK_UPDATE,
  PERMITS_IN_USE,
  RATE_INTERVAL,
  QUEUE_HEAD,
  QUEUE_NAMES,
  QUEUE_TAIL,
  QUEUE_VALUES,
  RELEASE_IF_NO_WAITERS_CONDITION,
  RELEASE_UPDATE,
  MARK_TICKET_CONDITION,
  SERVE_TICKET_CONDITION,
  SERVE_TICKET_UPDATE,
  SPLIT_HAND_OFF_CONDITION,
  SPLIT_HAND_OFF_UPDATE,
  STILL_HELD_CONDITION,
  STILL_HELD_UPDATE,
  TAKE_BACK_CONDITION,
  TAKE_BACK_UPDATE,
  TAKE_TICKET_CONDITION,
  TAKE_TICKET_UPDATE,
  TICKET_KEY_FORMAT,
  TICKET_SERVED_BY,
  TICKET_WAIT_TOKEN,
  TICKET_WAITER,
  VALUES,
  FIRST_WAIT_CONDITION,
  WAIT_AGAIN_CONDITION,
  WAIT_ON_TICKET_UPDATE,
} from './lock-schema';
import { currentRun, fencingTokenSelector, ownHolderKey } from './lock-tasks';
import { STATE } from './state-names';
import { ISemaphoreTable } from '../semaphore-table';

/*
 * The states of the queue wait strategy: a waiter that takes a ticket and sleeps in a `.waitForTaskToken`
 * task on the ticket's item, and the release that hands a permit to the waiter whose turn it is and
 * wakes it. See lock-schema.ts for the lock item and the ticket items.
 *
 * Waiter:   Acquire Permit ─full─▶ Take Ticket ─▶ Wait In Queue ──woken──▶ (body)
 *                                                  │ timed out: was the wake-up lost? is a permit free?
 *                                                  ▼
 *                                                Poll For Permit Again ─full─▶ Wait In Queue Again (same ticket, new token)
 *
 * Release:  Release Permit (only if nobody waits) ─waiters─▶ Peek At Next Waiter ─▶ Serve Ticket
 *           (deletes the ticket's item, reading it) ─▶ Hand Off Permit ─▶ Wake Next Waiter
 *           Serve Ticket refused (the ticket has no waiter yet, or was served) ─▶ Mark Ticket Served
 *           (or Read Served Ticket) ─▶ Check Ticket ─waiter─▶ Hand Off Permit; none ─▶ Peek At Next Waiter
 *           Peek claims the next ticket for this releaser; after a ticket without a waiter, or one
 *           whose waiter holds a permit already, it claims the next.
 *           Peek finds no waiter (served meanwhile) ─▶ Release Permit Without Hand-Off (only if nobody
 *           waits) ─waiters again─▶ Is Permit Still Held ─yes─▶ Peek At Next Waiter; no ─▶ done.
 *           A waiter that cannot be woken (its token is closed: it stopped, or its wait timed out
 *           just then) gets its permit taken back and passed on, by the same states.
 */

/** DynamoDB errors of the AWS SDK integration (`DynamoDb.` prefix), which the waits on a ticket use. */
const SDK_CONDITIONAL_CHECK_FAILED = 'DynamoDb.ConditionalCheckFailedException';
export const SDK_THROTTLING_ERRORS = THROTTLING_ERRORS.map((e) => e.replace(/^DynamoDB\./, 'DynamoDb.'));
const SDK_SERVER_ERRORS = SERVER_ERRORS.map((e) => e.replace(/^DynamoDB\./, 'DynamoDb.'));

/**
 * Errors of SendTaskSuccess with a token whose task no longer waits (AWS SDK integration names,
 * `Sfn.<Exception>`): TaskTimedOut for a closed token, TaskDoesNotExist, InvalidToken.
 * @see https://docs.aws.amazon.com/step-functions/latest/apireference/API_SendTaskSuccess.html
 */
export const TOKEN_GONE_ERRORS = ['Sfn.TaskTimedOutException', 'Sfn.TaskDoesNotExistException', 'Sfn.InvalidTokenException'];

/**
 * Errors of a throttled Step Functions call of an AWS SDK integration: `Sfn.SfnException` ("Rate
 * exceeded"), since ThrottlingException is no shape of the Step Functions API model and an AWS SDK
 * integration names such an error after the service's base exception
 * (https://docs.aws.amazon.com/step-functions/latest/dg/supported-services-awssdk.html); and
 * `Sfn.ThrottlingException` too, in case AWS ever names it so (it costs nothing if it never does).
 */
export const SFN_THROTTLED_ERRORS = ['Sfn.SfnException', 'Sfn.ThrottlingException'];

/** Where the release states keep their scratch data (the state data must be an object). */
export const HANDOFF_PATH = '$.handoff';

/**
 * What the hand-off chain calls to wake the waiter it hands a permit to (handOffChain's sfnCall states):
 * a role running it needs these on the waiters' state machines (wake-grants.ts).
 */
export const WAKE_ACTIONS = ['states:SendTaskSuccess', 'states:SendTaskHeartbeat'];

/** Names of the release states, with a suffix per use ('' for the success path; see state-names.ts). */
export function releaseStateNames(suffix: string) {
  return {
    release: `${STATE.release}${suffix}`,
    releaseWithoutHandOff: `${STATE.releaseWithoutHandOff}${suffix}`,
    peek: `${STATE.peekAtNextWaiter}${suffix}`,
    serveTicket: `${STATE.serveTicket}${suffix}`,
    markTicket: `${STATE.markTicket}${suffix}`,
    readTicket: `${STATE.readTicket}${suffix}`,
    checkTicket: `${STATE.checkTicket}${suffix}`,
    handOff: `${STATE.handOff}${suffix}`,
    wake: `${STATE.wakeNextWaiter}${suffix}`,
    isWaiterWaiting: `${STATE.isWaiterWaiting}${suffix}`,
    wakeAgain: `${STATE.wakeAgain}${suffix}`,
    takeBack: `${STATE.takeBackPermit}${suffix}`,
    confirmHandOff: `${STATE.confirmHandOff}${suffix}`,
    wakeUpLost: `${STATE.wakeUpLost}${suffix}`,
    stillHeld: `${STATE.stillHeld}${suffix}`,
    alreadyReleased: `${STATE.alreadyReleased}${suffix}`,
    handOffOne: `${STATE.handOffOne}${suffix}`,
    confirmHandOffOne: `${STATE.confirmHandOffOne}${suffix}`,
    wakeWaiterOfOne: `${STATE.wakeWaiterOfOne}${suffix}`,
    isWaiterOfOneWaiting: `${STATE.isWaiterOfOneWaiting}${suffix}`,
    wakeWaiterOfOneAgain: `${STATE.wakeWaiterOfOneAgain}${suffix}`,
    takeBackOne: `${STATE.takeBackOne}${suffix}`,
    keepBodySlot: `${STATE.keepBodySlot}${suffix}`,
    keepBodySlotWithoutHandOff: `${STATE.keepBodySlotWithoutHandOff}${suffix}`,
    handOffKeepingSlot: `${STATE.handOffKeepingSlot}${suffix}`,
    takeBackIntoSlot: `${STATE.takeBackIntoSlot}${suffix}`,
  };
}

export interface HandOffProps {
  readonly table: ISemaphoreTable;
  readonly lockName: tasks.DynamoAttributeValue;
  /** The lock name as a string: literal, or a JSONPath string token (the ticket items' keys start with it). */
  readonly lockNameText: string;
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
  /**
   * Whether the holder's entry may hold more than one permit (a workflow with `permits`): a hand-off
   * then gives the waiter one of them (SPLIT_HAND_OFF_UPDATE) and releases again, until one is left,
   * which moves as a whole. @default false
   */
  readonly weighted?: boolean;
  /**
   * Whether the holder's body may still run in its body slot (the release at the interval beside the
   * body, under a concurrency limit above the rate's count): the permit is given back or handed on and
   * the entry stays with no permit, keeping the slot (KEEP_SLOT_RELEASE, KEEP_SLOT_HAND_OFF); an entry
   * without a slot goes as a whole. Not with `weighted`. @default false
   */
  readonly keepSlot?: boolean;
}

/** The key of a lock's ticket item, for a lock name (literal or JSONPath string) and a JSONPath to the ticket. */
export function ticketItemKey(lockNameText: string, ticketPath: string): tasks.DynamoAttributeValue {
  return tasks.DynamoAttributeValue.fromString(sfn.JsonPath.format(TICKET_KEY_FORMAT, lockNameText, sfn.JsonPath.stringAt(ticketPath)));
}

/**
 * The release of the queue strategy, for the holder at `$.handoff.holder` (run `$.handoff.redriveCount`).
 *
 * Nobody waiting, it is one conditional write, as without a queue. With waiters, it claims the next
 * ticket (a write: it must still hold the permit), serves the ticket (deletes its item, which returns
 * the waiter and its token), moves the holder entry to the waiter (drawing its fencing token in the
 * same write) and wakes it: three writes and a call, beside the refused first one.
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
  // waiter, since a waiter can take a ticket between the two writes (the lock was full) and would then
  // sleep beside a free permit.
  const plainGiveBack = (id: string) =>
    end(
      new tasks.DynamoUpdateItem(scope, id, {
        table,
        key,
        // Beside a body that keeps its slot, only an entry without one goes as a whole.
        conditionExpression: props.keepSlot ? `${RELEASE_IF_NO_WAITERS_CONDITION} AND ${OUTSIDE_BODY}` : RELEASE_IF_NO_WAITERS_CONDITION,
        updateExpression: RELEASE_UPDATE,
        expressionAttributeNames: {
          [NAMES.permits]: PERMITS_IN_USE,
          [NAMES.holder]: holder,
          [QUEUE_NAMES.tail]: QUEUE_TAIL,
          [QUEUE_NAMES.head]: QUEUE_HEAD,
          [NAMES.collecting]: COLLECTING,
          [NAMES.collectGate]: COLLECT_GATE,
          [NAMES.bodies]: BODIES_RUNNING,
        },
        expressionAttributeValues: {
          [VALUES.zero]: tasks.DynamoAttributeValue.fromNumber(0),
          [VALUES.one]: tasks.DynamoAttributeValue.fromNumber(1),
          [VALUES.redriveCount]: redriveCount,
        },
        resultPath: sfn.JsonPath.DISCARD,
        ...endProps,
      }).addRetry(retry),
    );
  // Beside a body that keeps its slot: first the permit alone (the body runs on), then, refused, the
  // whole entry (one without a slot); both refused, the caller's catch follows the second.
  const giveBack = (id: string, keepSlotId: string): { first: sfn.State; last: sfn.TaskStateBase } => {
    const last = plainGiveBack(id);
    if (!props.keepSlot) return { first: last, last };
    const keep = end(
      new tasks.DynamoUpdateItem(scope, keepSlotId, {
        table,
        key,
        conditionExpression: KEEP_SLOT_RELEASE_CONDITION,
        updateExpression: KEEP_SLOT_RELEASE_UPDATE,
        expressionAttributeNames: {
          [NAMES.permits]: PERMITS_IN_USE,
          [NAMES.holder]: holder,
          [QUEUE_NAMES.tail]: QUEUE_TAIL,
          [QUEUE_NAMES.head]: QUEUE_HEAD,
          [NAMES.collecting]: COLLECTING,
          [NAMES.collectGate]: COLLECT_GATE,
        },
        expressionAttributeValues: {
          [VALUES.zero]: tasks.DynamoAttributeValue.fromNumber(0),
          [VALUES.one]: tasks.DynamoAttributeValue.fromNumber(1),
          [VALUES.redriveCount]: redriveCount,
        },
        resultPath: sfn.JsonPath.DISCARD,
        ...endProps,
      }).addRetry(retry),
    ).addCatch(last, { errors: [CONDITIONAL_CHECK_FAILED], resultPath: sfn.JsonPath.DISCARD });
    return { first: keep, last };
  };
  const withoutHandOff = giveBack(names.releaseWithoutHandOff, names.keepBodySlotWithoutHandOff);
  const releaseWithoutHandOff = withoutHandOff.last;
  // Refused: not held (any more), or a waiter came. Which? A no-op write conditional on the holder.
  // (Beside a body that keeps its slot: a permit, not only the slot, given back or handed on already.)
  const stillHeld = new tasks.DynamoUpdateItem(scope, names.stillHeld, {
    table,
    key,
    conditionExpression: props.keepSlot ? STILL_HOLDS_PERMIT_CONDITION : STILL_HELD_CONDITION,
    updateExpression: STILL_HELD_UPDATE,
    expressionAttributeNames: { [NAMES.permits]: PERMITS_IN_USE, [NAMES.holder]: holder },
    expressionAttributeValues: {
      [VALUES.redriveCount]: redriveCount,
      ...(props.keepSlot ? { [VALUES.zero]: tasks.DynamoAttributeValue.fromNumber(0) } : {}),
    },
    resultPath: sfn.JsonPath.DISCARD,
  })
    .addRetry(retry)
    .addCatch(alreadyReleased, { errors: [CONDITIONAL_CHECK_FAILED], resultPath: sfn.JsonPath.DISCARD });
  releaseWithoutHandOff.addCatch(stillHeld, { errors: [CONDITIONAL_CHECK_FAILED], resultPath: sfn.JsonPath.DISCARD });

  const releaseStates = giveBack(names.release, names.keepBodySlot);
  const release = releaseStates.first;

  // Claim the next ticket: the new head (a number).
  const peek = new tasks.DynamoUpdateItem(scope, names.peek, {
    table,
    key,
    conditionExpression: PEEK_CONDITION,
    updateExpression: PEEK_UPDATE,
    expressionAttributeNames: {
      [NAMES.holder]: holder,
      [QUEUE_NAMES.head]: QUEUE_HEAD,
      [QUEUE_NAMES.tail]: QUEUE_TAIL,
      [NAMES.permits]: PERMITS_IN_USE,
      [NAMES.collecting]: COLLECTING,
      [NAMES.collectGate]: COLLECT_GATE,
    },
    expressionAttributeValues: {
      [VALUES.redriveCount]: redriveCount,
      [VALUES.zero]: tasks.DynamoAttributeValue.fromNumber(0),
      [VALUES.one]: tasks.DynamoAttributeValue.fromNumber(1),
    },
    returnValues: tasks.DynamoReturnValues.UPDATED_NEW,
    resultSelector: {
      ticket: sfn.JsonPath.stringToJson(sfn.JsonPath.stringAt(`$.Attributes.${QUEUE_HEAD}.N`)),
    },
    resultPath: `${HANDOFF_PATH}.next`,
  })
    .addRetry(retry)
    // No permit to hand (released by someone else), or no waiter left (served by another releaser).
    .addCatch(withoutHandOff.first, { errors: [CONDITIONAL_CHECK_FAILED], resultPath: sfn.JsonPath.DISCARD });
  releaseStates.last.addCatch(peek, { errors: [CONDITIONAL_CHECK_FAILED], resultPath: sfn.JsonPath.DISCARD });
  stillHeld.next(peek);

  const ticketKeyValue = ticketItemKey(props.lockNameText, `${HANDOFF_PATH}.next.ticket`);
  const ticketItemKeyMap = { [LOCK_KEY]: ticketKeyValue };

  const ticketPath = `${HANDOFF_PATH}.ticket`;
  const ticketAttributes = `${ticketPath}.Item`;
  // The hand-off's id: the ticket this release claimed (no other claim ever gets it: the head only
  // grows) and the releaser's run (HOLDER_HANDOFF_ID). A few bytes in the waiter's entry, where a UUID took 36.
  const handoffIdText = sfn.JsonPath.format('{}/{}', sfn.JsonPath.stringAt(`${HANDOFF_PATH}.next.ticket`), sfn.JsonPath.stringAt('$$.Execution.RedriveCount'));
  // Serve the ticket: delete its item, which refuses every wait on it from now on (a waiter whose
  // wake-up is lost finds its permit instead of sleeping again: WAIT_AGAIN_CONDITION needs the item),
  // and read it in the same write (ALL_OLD): the waiter and the token of its current wait, final now.
  // Only an item with a waiter is served, so that success leads straight to the hand-off; and since
  // the item is gone, the hand-off's wake-up is the release's last call.
  const servedByName = { [QUEUE_NAMES.servedBy]: TICKET_SERVED_BY };
  const serveTicket = new tasks.DynamoDeleteItem(scope, names.serveTicket, {
    table,
    key: ticketItemKeyMap,
    conditionExpression: SERVE_TICKET_CONDITION,
    expressionAttributeNames: { ...servedByName, [QUEUE_NAMES.waiter]: TICKET_WAITER },
    returnValues: tasks.DynamoReturnValues.ALL_OLD,
    resultSelector: { Item: sfn.JsonPath.objectAt('$.Attributes') },
    resultPath: ticketPath,
  }).addRetry(retry);
  peek.next(serveTicket);
  // Refused: the ticket has no item (its waiter is still on its way, or it is an orphan), or it was
  // served already. Mark it all the same: on a ticket without an item the write creates it marked,
  // without a waiter, so that a waiter still on its way is refused and takes a new ticket (one that
  // wrote its item just now is served here).
  // (A serve whose response was lost, retried, finds no item either: its waiter was not woken, and the
  // mark passes its ticket. The waiter finds out when its wait times out, and takes a new ticket.)
  const markTicket = new tasks.DynamoUpdateItem(scope, names.markTicket, {
    table,
    key: ticketItemKeyMap,
    conditionExpression: MARK_TICKET_CONDITION,
    updateExpression: SERVE_TICKET_UPDATE,
    expressionAttributeNames: servedByName,
    expressionAttributeValues: { [QUEUE_VALUES.servedBy]: tasks.DynamoAttributeValue.fromString(handoffIdText) },
    returnValues: tasks.DynamoReturnValues.ALL_NEW,
    resultSelector: { Item: sfn.JsonPath.objectAt('$.Attributes') },
    resultPath: ticketPath,
  }).addRetry(retry);
  serveTicket.addCatch(markTicket, { errors: [CONDITIONAL_CHECK_FAILED], resultPath: sfn.JsonPath.DISCARD });
  // Served already: a retry of a write that landed, or marked by the sweep (its releaser stopped
  // before it served it). Read it, and serve it from here.
  const readTicket = new tasks.DynamoGetItem(scope, names.readTicket, {
    table,
    key: ticketItemKeyMap,
    consistentRead: true,
    // No item: deleted by the sweep since it marked it.
    resultPath: ticketPath,
  }).addRetry(retry);
  markTicket.addCatch(readTicket, { errors: [CONDITIONAL_CHECK_FAILED], resultPath: sfn.JsonPath.DISCARD });

  const waiterId = sfn.JsonPath.stringAt(`${ticketAttributes}.${TICKET_WAITER}.S`);
  // The hand-off's id, with the run that uses it: a run redriven after the hand-off neither confirms
  // nor takes back a hand-off of the run before (its wake-up may have been delivered: the waiter uses
  // the permit). Such a permit is freed by the waiter, its cleanup or the sweep.
  const handoffId = tasks.DynamoAttributeValue.fromString(handoffIdText);
  // The waiter's entry: one permit, its run and lease from the ticket, and this hand-off's id.
  const waiterEntry = tasks.DynamoAttributeValue.fromMap({
    [HOLDER_ACQUIRED_AT]: tasks.DynamoAttributeValue.fromString(sfn.JsonPath.stringAt('$$.State.EnteredTime')),
    [HOLDER_REDRIVE_COUNT]: tasks.DynamoAttributeValue.numberFromString(sfn.JsonPath.stringAt(`${ticketAttributes}.${HOLDER_REDRIVE_COUNT}.N`)),
    [HOLDER_LEASE_SECONDS]: tasks.DynamoAttributeValue.numberFromString(sfn.JsonPath.stringAt(`${ticketAttributes}.${HOLDER_LEASE_SECONDS}.N`)),
    [HOLDER_HANDOFF_ID]: handoffId,
  });
  // The fencing counter before the hand-off drew the waiter's token from it (UPDATED_OLD).
  const handOffSelector = {
    fencingToken: sfn.JsonPath.mathAdd(Token.asNumber(sfn.JsonPath.stringToJson(sfn.JsonPath.stringAt(`$.Attributes.${FENCING_TOKEN}.N`))), 1),
  };
  const handOff = new tasks.DynamoUpdateItem(scope, names.handOff, {
    table,
    key,
    // Beside a body that keeps its slot, only an entry without one moves as a whole.
    conditionExpression: props.keepSlot ? `${HAND_OFF_CONDITION} AND ${OUTSIDE_BODY}` : HAND_OFF_CONDITION,
    updateExpression: HAND_OFF_UPDATE,
    expressionAttributeNames: {
      [NAMES.holder]: holder,
      [QUEUE_NAMES.next]: waiterId,
      [NAMES.fence]: FENCING_TOKEN,
      [NAMES.permits]: PERMITS_IN_USE,
      [NAMES.bodies]: BODIES_RUNNING,
    },
    expressionAttributeValues: {
      [VALUES.redriveCount]: redriveCount,
      [VALUES.zero]: tasks.DynamoAttributeValue.fromNumber(0),
      [VALUES.one]: tasks.DynamoAttributeValue.fromNumber(1),
      [VALUES.entry]: waiterEntry,
    },
    returnValues: tasks.DynamoReturnValues.UPDATED_OLD,
    resultSelector: handOffSelector,
    resultPath: `${HANDOFF_PATH}.wake`,
  })
    // A retry after a write that landed would fail its condition and lose the wake-up: server errors
    // are confirmed instead (below).
    .addRetry(transientRetry(THROTTLING_ERRORS))
    // Its waiter holds a permit already (it found one by polling), or ours is gone: claim the next
    // ticket. The waiter can be the releaser itself (a ticket from before it got its permit by
    // polling): then DynamoDB rejects the update (its two paths overlap), and the same goes.
    .addCatch(peek, { errors: [CONDITIONAL_CHECK_FAILED, VALIDATION_ERROR], resultPath: sfn.JsonPath.DISCARD });

  const wakeUpLost = props.next ?? new sfn.Succeed(scope, names.wakeUpLost, { outputPath: props.outputPath });

  const tokenPath = `${ticketAttributes}.${TICKET_WAIT_TOKEN}.S`;
  // AWS SDK integration tasks written as ASL (CustomState), not CallAwsService: CallAwsService puts its
  // grant in the role's default policy, which the state machine depends on, and the grant names the
  // state machines of the waiters (this one among them): a dependency cycle. wake-grants.ts grants these
  // calls in a policy of their own, on the state machines whose executions wait on the table's locks.
  const sfnCall = (id: string, action: string, parameters: object, outputPath?: string) =>
    new sfn.CustomState(scope, id, {
      stateJson: {
        Type: 'Task',
        Resource: `arn:${Aws.PARTITION}:states:::aws-sdk:sfn:${action}`,
        Parameters: parameters,
        ResultPath: null,
        ...(outputPath === undefined ? {} : { OutputPath: outputPath }),
      },
    });
  // The wake-up is the last call of a hand-off: where it ends the execution, it gives its output (`outputPath`).
  const sendWakeUp = (id: string, outputPath?: string) =>
    sfnCall(id, 'sendTaskSuccess', { 'TaskToken.$': tokenPath, 'Output.$': `States.JsonToString(${HANDOFF_PATH}.wake)` }, outputPath);

  /**
   * What follows a hand-off (of a whole entry, or of one of a weighted entry's permits): confirm it
   * after a server error (did it land? its id is in the waiter's entry if and only if it did), and
   * wake the waiter (its ticket's item went when the ticket was served). A waiter whose task is gone
   * has its permit taken back (`takeBack`); any other failure to wake it is a lost wake-up (`lost`),
   * which the waiter finds when its wait times out. After the wake-up the chain goes to `then`, else
   * it ends as the release does. `takeBack` is built after the confirm, so that the rendered
   * definitions keep their order.
   */
  const wakeChain = (
    ids: { confirm: string; wake: string; isWaiting: string; wakeAgain: string },
    to: { takeBack: () => sfn.IChainable; lost: sfn.IChainable; then?: sfn.IChainable },
  ) => {
    const confirm = new tasks.DynamoUpdateItem(scope, ids.confirm, {
      table,
      key,
      conditionExpression: CONFIRM_HAND_OFF_CONDITION,
      updateExpression: CONFIRM_HAND_OFF_UPDATE,
      expressionAttributeNames: { [QUEUE_NAMES.next]: waiterId, [NAMES.fence]: FENCING_TOKEN },
      expressionAttributeValues: { [QUEUE_VALUES.handoffId]: handoffId },
      returnValues: tasks.DynamoReturnValues.UPDATED_NEW,
      resultSelector: { fencingToken: sfn.JsonPath.stringToJson(sfn.JsonPath.stringAt(`$.Attributes.${FENCING_TOKEN}.N`)) },
      resultPath: `${HANDOFF_PATH}.wake`,
    })
      .addRetry(retry)
      .addCatch(release, { errors: [CONDITIONAL_CHECK_FAILED], resultPath: sfn.JsonPath.DISCARD });
    const takeBack = to.takeBack();
    const after = to.then ?? props.next;
    // Nothing after the wake-up: it ends the execution, with the release's output.
    const wakeOutputPath = after ? undefined : props.outputPath;
    const woken = <T extends sfn.CustomState>(state: T): T => {
      if (after) state.next(after);
      return state;
    };
    // The wake-up is never retried blindly: a retry of a call that did wake the waiter would hear
    // TaskTimedOut and take back the permit the waiter is using. After a throttled call (SFN_THROTTLED_ERRORS),
    // whatever it did, a heartbeat on the token tells: it is refused once the task has ended (woken, timed
    // out or stopped), and succeeds only while the waiter still waits, when a second wake-up is safe.
    const wakeAgain = woken(
      sendWakeUp(ids.wakeAgain, wakeOutputPath)
        // Whatever fails now, the waiter finds its permit when its wait times out (no take-back from here).
        .addCatch(to.lost, { errors: [sfn.Errors.ALL], resultPath: sfn.JsonPath.DISCARD }),
    );
    const isWaiting = sfnCall(ids.isWaiting, 'sendTaskHeartbeat', { 'TaskToken.$': tokenPath })
      // A heartbeat changes nothing but the task's heartbeat clock: any failure of it may be retried.
      .addRetry({ errors: SFN_THROTTLED_ERRORS, interval: Duration.seconds(1), backoffRate: 2, maxAttempts: 5, jitterStrategy: sfn.JitterType.FULL })
      // The token is closed (the wake-up landed, or the wait ended): as a lost wake-up.
      .addCatch(to.lost, { errors: [sfn.Errors.ALL], resultPath: sfn.JsonPath.DISCARD })
      .next(wakeAgain);
    const wake = woken(
      sendWakeUp(ids.wake, wakeOutputPath)
        .addCatch(takeBack, { errors: TOKEN_GONE_ERRORS, resultPath: sfn.JsonPath.DISCARD })
        .addCatch(isWaiting, { errors: SFN_THROTTLED_ERRORS, resultPath: sfn.JsonPath.DISCARD })
        // Any other failure is a lost wake-up: the waiter finds its permit when its wait times out.
        .addCatch(to.lost, { errors: [sfn.Errors.ALL], resultPath: sfn.JsonPath.DISCARD }),
    );
    confirm.next(wake);
    return { confirm, wake };
  };

  // The woken waiter's task has gone (the execution stopped, or its wait timed out just then): take
  // the permit back, unless the waiter found and claimed it meanwhile, and hand it on.
  const takeBackPermit = () => {
    const takeBack = new tasks.DynamoUpdateItem(scope, names.takeBack, {
      table,
      key,
      conditionExpression: TAKE_BACK_CONDITION,
      updateExpression: TAKE_BACK_UPDATE,
      expressionAttributeNames: { [NAMES.holder]: holder, [QUEUE_NAMES.next]: waiterId },
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
    if (!props.keepSlot) return takeBack;
    // Beside a body that keeps its slot, the permit was handed on from an entry that stays (KEEP_SLOT_HAND_OFF):
    // it goes back into that entry. Refused, that entry is gone (a force-release), or this was a whole
    // entry's hand-off (an entry without a slot), or the waiter claimed it: Take Back Permit tells.
    const takeBackIntoSlot = new tasks.DynamoUpdateItem(scope, names.takeBackIntoSlot, {
      table,
      key,
      conditionExpression: TAKE_BACK_INTO_SLOT_CONDITION,
      updateExpression: TAKE_BACK_INTO_SLOT_UPDATE,
      expressionAttributeNames: { [NAMES.holder]: holder, [QUEUE_NAMES.next]: waiterId },
      expressionAttributeValues: {
        [QUEUE_VALUES.handoffId]: handoffId,
        [VALUES.zero]: tasks.DynamoAttributeValue.fromNumber(0),
        [VALUES.redriveCount]: redriveCount,
      },
      resultPath: sfn.JsonPath.DISCARD,
    })
      .addRetry(retry)
      .addCatch(takeBack, { errors: [CONDITIONAL_CHECK_FAILED], resultPath: sfn.JsonPath.DISCARD });
    takeBackIntoSlot.next(release);
    return takeBackIntoSlot;
  };

  const unit = wakeChain(
    {
      confirm: names.confirmHandOff,
      wake: names.wake,
      isWaiting: names.isWaiterWaiting,
      wakeAgain: names.wakeAgain,
    },
    { takeBack: takeBackPermit, lost: wakeUpLost },
  );
  handOff.addCatch(unit.confirm, { errors: SERVER_ERRORS, resultPath: sfn.JsonPath.DISCARD });
  handOff.next(unit.wake);

  // A hand-off of one permit from an entry that stays (a weighted entry's, or one that keeps its body
  // slot): as Hand Off Permit, with its own condition and update; refused, as any holder's hand-off.
  const handOffPart = (id: string, condition: string, update: string) =>
    new tasks.DynamoUpdateItem(scope, id, {
      table,
      key,
      conditionExpression: condition,
      updateExpression: update,
      expressionAttributeNames: { [NAMES.holder]: holder, [QUEUE_NAMES.next]: waiterId, [NAMES.fence]: FENCING_TOKEN },
      expressionAttributeValues: {
        [VALUES.redriveCount]: redriveCount,
        [VALUES.zero]: tasks.DynamoAttributeValue.fromNumber(0),
        [VALUES.one]: tasks.DynamoAttributeValue.fromNumber(1),
        [VALUES.entry]: waiterEntry,
      },
      returnValues: tasks.DynamoReturnValues.UPDATED_OLD,
      resultSelector: handOffSelector,
      resultPath: `${HANDOFF_PATH}.wake`,
    })
      .addRetry(transientRetry(THROTTLING_ERRORS))
      .addCatch(handOff, { errors: [CONDITIONAL_CHECK_FAILED, VALIDATION_ERROR], resultPath: sfn.JsonPath.DISCARD });

  let firstHandOff: sfn.State = handOff;
  if (props.weighted) {
    // A weighted holder hands one of its permits to the waiter and keeps the rest, then releases
    // again: it gives back what is left if nobody waits, else hands on the next one. Its entry of one
    // permit, at last, moves as a whole (Hand Off Permit). A waiter whose task is gone has the permit
    // taken back into the entry, as after any hand-off.
    // Refused for an entry of one permit (or the waiter holds one, or ours is gone).
    const handOffOne = handOffPart(names.handOffOne, SPLIT_HAND_OFF_CONDITION, SPLIT_HAND_OFF_UPDATE);
    // The waiter's task is gone: take its permit back into this entry (unless it claimed it), and
    // release again, which hands it on.
    const takeBackOne = new tasks.DynamoUpdateItem(scope, names.takeBackOne, {
      table,
      key,
      conditionExpression: TAKE_BACK_ONE_CONDITION,
      updateExpression: TAKE_BACK_ONE_UPDATE,
      expressionAttributeNames: { [NAMES.holder]: holder, [QUEUE_NAMES.next]: waiterId },
      expressionAttributeValues: {
        [QUEUE_VALUES.handoffId]: handoffId,
        [VALUES.one]: tasks.DynamoAttributeValue.fromNumber(1),
        [VALUES.redriveCount]: redriveCount,
      },
      resultPath: sfn.JsonPath.DISCARD,
    })
      .addRetry(retry)
      .addCatch(release, { errors: [CONDITIONAL_CHECK_FAILED], resultPath: sfn.JsonPath.DISCARD })
      .next(release);
    // As after any hand-off, but the holder keeps permits: whatever happens, it releases again.
    const one = wakeChain(
      {
        confirm: names.confirmHandOffOne,
        wake: names.wakeWaiterOfOne,
        isWaiting: names.isWaiterOfOneWaiting,
        wakeAgain: names.wakeWaiterOfOneAgain,
      },
      { takeBack: () => takeBackOne, lost: release, then: release },
    );
    handOffOne.addCatch(one.confirm, { errors: SERVER_ERRORS, resultPath: sfn.JsonPath.DISCARD });
    handOffOne.next(one.wake);
    firstHandOff = handOffOne;
  }
  if (props.keepSlot) {
    // The body may run on in its slot: hand on the permit alone, the entry stays with none. Refused (an
    // entry without a slot, or the waiter holds a permit, or ours is gone), as any holder's hand-off.
    const handOffKeepingSlot = handOffPart(names.handOffKeepingSlot, KEEP_SLOT_HAND_OFF_CONDITION, KEEP_SLOT_HAND_OFF_UPDATE);
    // The same confirm, wake-up and take-back as the whole entry's hand-off: the take-back tells the two apart.
    handOffKeepingSlot.addCatch(unit.confirm, { errors: SERVER_ERRORS, resultPath: sfn.JsonPath.DISCARD });
    handOffKeepingSlot.next(unit.wake);
    firstHandOff = handOffKeepingSlot;
  }
  serveTicket.next(firstHandOff);
  const checkTicket = new sfn.Choice(scope, names.checkTicket)
    .when(sfn.Condition.isPresent(`${ticketAttributes}.${TICKET_WAITER}`), firstHandOff)
    .otherwise(peek);
  markTicket.next(checkTicket);
  readTicket.next(checkTicket);
  return release;
}

export interface WaiterProps {
  readonly table: ISemaphoreTable;
  readonly lockName: tasks.DynamoAttributeValue;
  /** The lock name as a string: literal, or a JSONPath string token. */
  readonly lockNameText: string;
  readonly limit: tasks.DynamoAttributeValue;
  /** Lease of the workflow, seconds (0: none): the holder entry a hand-off writes carries it. */
  readonly leaseSeconds: number;
  /** How long a waiter sleeps before it checks whether its wake-up was lost. */
  readonly checkInterval: Duration;
  /** Where the wake-up's `{ fencingToken }` goes. @default - discarded */
  readonly permitPath?: string;
  /** A weighted waiter's gate (the limit less its weight): it queues while more are in use. @default - a waiter of one permit */
  readonly gate?: tasks.DynamoAttributeValue;
  /**
   * The workflow's rate interval, seconds: the ticket records it on the lock as the acquire does, so that
   * a lock whose executions all come in by hand-off (behind a client that took it first) records it too.
   * @default - no rate
   */
  readonly rateIntervalSeconds?: number;
}

/** Where a waiter keeps its ticket (a number) in the state data. */
export const TICKET_PATH = '$.semaphoreTicket';

/** The path of `field` in the object at `path` (`$` included). */
function fieldAt(path: string, field: string): string {
  return path === '$' ? `$.${field}` : `${path}.${field}`;
}

/**
 * "Take Ticket": a ticket in the lock's queue, only while the lock is full and this execution holds
 * nothing (TAKE_TICKET_CONDITION). Its output, `{ ticket }`, goes to `ticketPath` (TICKET_PATH, or `$`
 * for a first wait outside the Parallel whose state data is the execution's input).
 */
export function takeTicketTask(scope: Construct, id: string, props: WaiterProps, ticketPath = TICKET_PATH): tasks.DynamoUpdateItem {
  const rate = props.rateIntervalSeconds;
  return new tasks.DynamoUpdateItem(scope, id, {
    table: props.table.table,
    key: { [LOCK_KEY]: props.lockName },
    // A weighted waiter queues while more than the limit less its weight are in use.
    conditionExpression: props.gate ? WEIGHTED_TAKE_TICKET_CONDITION : TAKE_TICKET_CONDITION,
    updateExpression: rate === undefined ? TAKE_TICKET_UPDATE : `${TAKE_TICKET_UPDATE}, ${NAMES.rate} = ${VALUES.rate}`,
    expressionAttributeNames: {
      [NAMES.permits]: PERMITS_IN_USE,
      [NAMES.holder]: ownHolderKey(),
      [QUEUE_NAMES.tail]: QUEUE_TAIL,
      [QUEUE_NAMES.head]: QUEUE_HEAD,
      [NAMES.collecting]: COLLECTING,
      ...(rate === undefined ? {} : { [NAMES.rate]: RATE_INTERVAL }),
    },
    expressionAttributeValues: {
      ...(rate === undefined ? {} : { [VALUES.rate]: tasks.DynamoAttributeValue.fromNumber(rate) }),
      ...(props.gate ? { [VALUES.gate]: props.gate } : { [VALUES.limit]: props.limit }),
      [VALUES.zero]: tasks.DynamoAttributeValue.fromNumber(0),
      [VALUES.one]: tasks.DynamoAttributeValue.fromNumber(1),
    },
    returnValues: tasks.DynamoReturnValues.UPDATED_NEW,
    resultSelector: { ticket: sfn.JsonPath.stringToJson(sfn.JsonPath.stringAt(`$.Attributes.${QUEUE_TAIL}.N`)) },
    resultPath: ticketPath,
  });
}

/**
 * "Wait In Queue" (and "Wait In Queue Again", after a wait timed out): write the ticket's item with
 * the task token of this wait and sleep until a releaser hands this execution a permit. Refused once
 * the ticket's turn has come. Its output is `{ fencingToken }`.
 */
export function waitOnTicketTask(
  scope: Construct,
  id: string,
  props: WaiterProps,
  again: boolean,
  ticketPath = TICKET_PATH,
  outputPath?: string,
): sfn.TaskStateBase {
  return new tasks.CallAwsService(scope, id, {
    service: 'dynamodb',
    action: 'updateItem',
    integrationPattern: sfn.IntegrationPattern.WAIT_FOR_TASK_TOKEN,
    parameters: {
      TableName: props.table.table.tableName,
      Key: { [LOCK_KEY]: ticketItemKey(props.lockNameText, fieldAt(ticketPath, 'ticket')).toObject() },
      UpdateExpression: WAIT_ON_TICKET_UPDATE,
      ConditionExpression: again ? WAIT_AGAIN_CONDITION : FIRST_WAIT_CONDITION,
      ExpressionAttributeNames: {
        [QUEUE_NAMES.servedBy]: TICKET_SERVED_BY,
        [QUEUE_NAMES.waiter]: TICKET_WAITER,
        [QUEUE_NAMES.run]: HOLDER_REDRIVE_COUNT,
        [QUEUE_NAMES.lease]: HOLDER_LEASE_SECONDS,
        [QUEUE_NAMES.token]: TICKET_WAIT_TOKEN,
        [NAMES.limit]: CONCURRENCY_LIMIT,
      },
      ExpressionAttributeValues: {
        [QUEUE_VALUES.me]: { S: ownHolderKey() },
        [VALUES.redriveCount]: { N: sfn.JsonPath.jsonToString(sfn.JsonPath.objectAt('$$.Execution.RedriveCount')) },
        [QUEUE_VALUES.lease]: { N: String(props.leaseSeconds) },
        // Its own limit: the reconciler hands it a free permit only below it.
        [VALUES.limit]: props.limit.toObject(),
        [QUEUE_VALUES.token]: { S: sfn.JsonPath.taskToken },
      },
    },
    iamAction: 'dynamodb:UpdateItem',
    // As the DynamoDB tasks' own grant, so that the two statements are one.
    iamResources: [Stack.of(scope).formatArn({ service: 'dynamodb', resource: 'table', resourceName: props.table.table.tableName })],
    taskTimeout: sfn.Timeout.duration(props.checkInterval),
    resultPath: props.permitPath ?? sfn.JsonPath.DISCARD,
    outputPath,
  }).addRetry(transientRetry(SDK_THROTTLING_ERRORS));
}

/**
 * "Leave Queue": delete the ticket's item of an execution that took a permit by polling while its
 * ticket still waited, only while nobody served it and the waiter is still this run (WAIT_AGAIN_CONDITION).
 * When its turn comes, the release then skips the ticket as one whose item was never written, where it
 * would have handed this execution a second permit (refused while it holds the first; after it gave
 * that back, taken back only once the wake-up is refused). Refused (served meanwhile), the release
 * finds the permit it holds and serves the next ticket.
 */
export function leaveQueueTask(scope: Construct, id: string, props: WaiterProps, outputPath?: string): sfn.TaskStateBase {
  return new tasks.DynamoDeleteItem(scope, id, {
    table: props.table.table,
    key: { [LOCK_KEY]: ticketItemKey(props.lockNameText, `${TICKET_PATH}.ticket`) },
    conditionExpression: WAIT_AGAIN_CONDITION,
    expressionAttributeNames: {
      [QUEUE_NAMES.servedBy]: TICKET_SERVED_BY,
      [QUEUE_NAMES.waiter]: TICKET_WAITER,
      [QUEUE_NAMES.run]: HOLDER_REDRIVE_COUNT,
    },
    expressionAttributeValues: {
      [QUEUE_VALUES.me]: tasks.DynamoAttributeValue.fromString(ownHolderKey()),
      [VALUES.redriveCount]: currentRun(),
    },
    resultPath: sfn.JsonPath.DISCARD,
    outputPath,
  })
    // Two retries, not ten: the execution holds its permit meanwhile, and without the delete it still
    // goes in (the ticket stays, as before this state).
    .addRetry({ ...transientRetry([...THROTTLING_ERRORS, ...SERVER_ERRORS]), maxAttempts: 2 });
}

/** Where "Poll For Permit Again" keeps the `{ fencingToken }` it took until "Leave Queue" makes it the branch's result. */
export const POLLED_PERMIT_PATH = '$.polledPermit';

/**
 * The wait's errors: refused (the ticket's turn has come, or the ticket is of another run); uncertain
 * (a server error: did the write land?); timed out (no wake-up within `queueCheckInterval`).
 */
export const WAIT_REFUSED = [SDK_CONDITIONAL_CHECK_FAILED];
export const WAIT_UNCERTAIN = SDK_SERVER_ERRORS;
export const WAIT_TIMED_OUT = [sfn.Errors.TIMEOUT];

/**
 * The values that stamp the execution's entry as claimed by this run, now (`:claimed`, `:acquiredAt`,
 * `:redriveCount`): every claim (CLAIM_UPDATE) and the collector's registration.
 */
export function claimStampValues(): Record<string, tasks.DynamoAttributeValue> {
  return {
    [QUEUE_VALUES.claimed]: tasks.DynamoAttributeValue.fromBoolean(true),
    [VALUES.acquiredAt]: tasks.DynamoAttributeValue.fromString(sfn.JsonPath.stringAt('$$.State.EnteredTime')),
    [VALUES.redriveCount]: currentRun(),
  };
}

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
  props: {
    table: ISemaphoreTable;
    lockName: tasks.DynamoAttributeValue;
    permitPath?: string;
    weight?: tasks.DynamoAttributeValue;
    /** Another claim's condition (a weighted waiter's of a handed entry of one permit). @default CLAIM_CONDITION, or WEIGHTED_CLAIM_CONDITION with a weight */
    condition?: string;
  },
): sfn.TaskStateBase {
  return new tasks.DynamoUpdateItem(scope, id, {
    table: props.table.table,
    key: { [LOCK_KEY]: props.lockName },
    // A weighted holder claims only an entry that holds all its permits (WEIGHTED_CLAIM_CONDITION).
    conditionExpression: props.condition ?? (props.weight ? WEIGHTED_CLAIM_CONDITION : CLAIM_CONDITION),
    updateExpression: CLAIM_UPDATE,
    expressionAttributeNames: {
      [NAMES.holder]: ownHolderKey(),
      [NAMES.fence]: FENCING_TOKEN,
    },
    expressionAttributeValues: {
      [VALUES.zero]: tasks.DynamoAttributeValue.fromNumber(0),
      [VALUES.one]: tasks.DynamoAttributeValue.fromNumber(1),
      ...claimStampValues(),
      ...(props.weight ? { [VALUES.weight]: props.weight } : {}),
    },
    returnValues: props.permitPath ? tasks.DynamoReturnValues.UPDATED_NEW : undefined,
    resultSelector: props.permitPath ? fencingTokenSelector() : undefined,
    resultPath: props.permitPath ?? sfn.JsonPath.DISCARD,
  }).addRetry(transientRetry([...THROTTLING_ERRORS, ...SERVER_ERRORS]));
}
