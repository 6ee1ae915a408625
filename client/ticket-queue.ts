import { AttributeValue } from '@aws-sdk/client-dynamodb';
import { dynamodb, errorName, Flow } from './effects';
import {
  DELETE_SERVED_CONDITION,
  LOCK_KEY,
  QUEUE_HEAD,
  QUEUE_NAMES,
  QUEUE_TAIL,
  QUEUE_VALUES,
  MARK_TICKET_CONDITION,
  SERVE_TICKET_UPDATE,
  ticketKey,
  TICKET_SERVED_BY,
} from '../src/private/lock-schema';

/*
 * The queue's ticket items, as the client and the reconciler use them (the workflows do the same in
 * src/private/queue-states.ts). See lock-schema.ts for the layout.
 */

type Item = Record<string, AttributeValue>;

/**
 * Of a lock's queued executions, how many the rate keeps waiting: one for each permit the rate holds
 * (`permitsHeldForRate`: still inside its acquisition's interval), at most all of them; the others wait
 * for permits that only running bodies (or leases) hold. Where a body keeps its permit until it ends
 * (a `concurrencyLimit` at or below the rate's count), one inside its interval holds it for both.
 */
export function waitingForRate(queued: number, heldForRate: number): number {
  return Math.min(queued, heldForRate);
}

/** The tickets a lock item says are waiting: from `head + 1` to `tail`. */
export function waitingTickets(item: Item | undefined): { head: number; tail: number } {
  const tail = Number(item?.[QUEUE_TAIL]?.N ?? '0');
  const head = Number(item?.[QUEUE_HEAD]?.N ?? '0');
  return { head, tail };
}

/** A ticket's item, read strongly consistent. */
export function* readTicket(tableName: string, lockName: string, ticket: number): Flow<Item | undefined> {
  const out = yield* dynamodb('GetItem', { TableName: tableName, Key: { [LOCK_KEY]: { S: ticketKey(lockName, ticket) } }, ConsistentRead: true });
  return out.Item;
}

/**
 * Serve a ticket (MARK_TICKET_CONDITION): mark its item with `handoffId` and return it. A ticket
 * served already (by a releaser that has not passed it yet, or that stopped) is read instead: whoever
 * passes the ticket first hands the permit.
 */
export function* serveTicket(tableName: string, lockName: string, ticket: number, handoffId: string): Flow<Item | undefined> {
  try {
    const out = yield* dynamodb('UpdateItem', {
      TableName: tableName,
      Key: { [LOCK_KEY]: { S: ticketKey(lockName, ticket) } },
      UpdateExpression: SERVE_TICKET_UPDATE,
      ConditionExpression: MARK_TICKET_CONDITION,
      ExpressionAttributeNames: { [QUEUE_NAMES.servedBy]: TICKET_SERVED_BY },
      ExpressionAttributeValues: { [QUEUE_VALUES.servedBy]: { S: handoffId } },
      ReturnValues: 'ALL_NEW',
    });
    return out.Attributes;
  } catch (e) {
    if (errorName(e) !== 'ConditionalCheckFailedException') throw e;
  }
  return yield* readTicket(tableName, lockName, ticket);
}

/** Delete a ticket's item, only if it is marked `servedBy` (true when it was). */
export function* deleteServedTicket(tableName: string, lockName: string, ticket: number, servedBy: string): Flow<boolean> {
  try {
    yield* dynamodb('DeleteItem', {
      TableName: tableName,
      Key: { [LOCK_KEY]: { S: ticketKey(lockName, ticket) } },
      ConditionExpression: DELETE_SERVED_CONDITION,
      ExpressionAttributeNames: { [QUEUE_NAMES.servedBy]: TICKET_SERVED_BY },
      ExpressionAttributeValues: { [QUEUE_VALUES.servedBy]: { S: servedBy } },
    });
    return true;
  } catch (e) {
    if (errorName(e) === 'ConditionalCheckFailedException') return false;
    throw e;
  }
}
