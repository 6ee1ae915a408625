import { createHash } from 'crypto';
// (dynamodb.ts imports this module too: what comes from it is used at run time only, never at load.)
import { itemSizeBytes, TaskError, writeUnits } from './dynamodb';

/*
 * DynamoDB's transactions, which dynalite (the simulator's DynamoDB) lacks, built on its item actions.
 * The database runs a transaction alone (LocalDynamoDb holds every other call until it ends), so that
 * its actions can be applied one after the other and undone when one is refused: nobody sees the
 * state in between. No two actions of a transaction touch the same item, so the order in which they
 * are applied does not change what each condition sees.
 * https://docs.aws.amazon.com/amazondynamodb/latest/APIReference/API_TransactWriteItems.html
 * https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/transaction-apis.html
 *
 * What it does not model: the 4 MB bound on a transaction's items (a request over it is refused loudly);
 * TransactionInProgressException. Conflicts between a transaction and concurrent calls on its items are
 * the capacity model's (DynamoTaskRunner, `transactionMillis`): here a transaction is applied at once.
 */

/** The item actions a transaction's actions run as, on the database alone. */
export interface TransactionStore {
  /** An item action of dynalite's, with its checks; errors named as DynamoDB names them. */
  call(action: string, input: Record<string, any>): Promise<Record<string, any>>;
  /** An item's key, by its table's key schema. */
  keyOf(tableName: string, item: Record<string, unknown>): Promise<Record<string, unknown>>;
  /** The partition an item's key goes to: its table and partition key value (LocalDynamoDb.partitionOf). */
  partitionOf(tableName: string, key: Record<string, unknown>): Promise<string>;
  /** Now, epoch milliseconds: the idempotency window of ClientRequestToken. */
  now(): number;
}

/** Per item of a transaction: its partition (table and partition key value) and the capacity units it consumed. */
export interface ItemUnits {
  readonly partition: string;
  readonly write: number;
  readonly read: number;
  /** The item's size the units were billed by. */
  readonly bytes: number;
}

/** A transaction's answer, and the units each of its items consumed (for the capacity model). */
export interface TransactionResult {
  readonly response: Record<string, unknown>;
  readonly items: ItemUnits[];
}

type WriteKind = 'Put' | 'Update' | 'Delete' | 'ConditionCheck';
const WRITE_KINDS: WriteKind[] = ['Put', 'Update', 'Delete', 'ConditionCheck'];
/** The most actions in one transaction. */
export const MAX_TRANSACTION_ITEMS = 100;
/** The largest request the simulator takes for a transaction, bytes (DynamoDB bounds the items at 4 MB). */
const MAX_TRANSACTION_BYTES = 4 * 1024 * 1024;
/** How long DynamoDB remembers a ClientRequestToken. */
const IDEMPOTENCY_WINDOW_MS = 10 * 60 * 1000;

/** A cancelled transaction: DynamoDB's TransactionCanceledException, with a reason per action (and the units its items consumed). */
export interface TransactionCanceled extends TaskError {
  readonly CancellationReasons: Array<Record<string, unknown>>;
  readonly items: ItemUnits[];
}

/** A TransactionCanceledException with its reasons; `items`, the units its items consumed (none for one cancelled before it was tried). */
export function transactionCanceled(reasons: Array<Record<string, unknown>>, items: ItemUnits[] = []): TransactionCanceled {
  const codes = reasons.map((r) => r.Code).join(', ');
  const error = new TaskError('TransactionCanceledException', `Transaction cancelled, please refer cancellation reasons for specific reasons [${codes}]`);
  return Object.assign(error, { CancellationReasons: reasons, items });
}

/** Serves TransactWriteItems and TransactGetItems; remembers tokens for their idempotency window. */
export class Transactions {
  private readonly tokens = new Map<string, { request: string; at: number; result: TransactionResult }>();

  constructor(private readonly store: TransactionStore) {}

  public async serve(action: string, input: Record<string, any>): Promise<TransactionResult> {
    if (action === 'TransactGetItems') return this.get(input);
    if (action !== 'TransactWriteItems') throw new TaskError('UnknownOperationException', `unknown action ${action}`);
    const token = input.ClientRequestToken;
    if (token === undefined) return this.write(input);
    if (typeof token !== 'string' || token.length < 1 || token.length > 36) {
      throw new TaskError('ValidationException', `1 validation error detected: Value '${token}' at 'clientRequestToken' failed to satisfy constraint: Member must have length between 1 and 36`);
    }
    // The same token within ten minutes: the same request is answered as before without being applied
    // again; another request is refused.
    const now = this.store.now();
    for (const [t, seen] of this.tokens) if (now - seen.at > IDEMPOTENCY_WINDOW_MS) this.tokens.delete(t);
    const { ClientRequestToken: _token, ReturnConsumedCapacity: _capacity, ...request } = input;
    const fingerprint = createHash('sha256').update(JSON.stringify(request)).digest('hex');
    const seen = this.tokens.get(token);
    if (seen !== undefined) {
      if (seen.request !== fingerprint) {
        throw new TaskError('IdempotentParameterMismatchException', 'The request uses the same client token as a previous, but non-identical request.');
      }
      // A repeat changes nothing; it is billed here as transactional reads of the items (an assumption: AWS
      // documents that the repeat makes no change, not what it consumes).
      return { response: seen.result.response, items: seen.result.items.map((i) => ({ ...i, write: 0, read: transactionalReadUnits(i.bytes) })) };
    }
    const result = await this.write(input);
    this.tokens.set(token, { request: fingerprint, at: now, result });
    return result;
  }

  private async write(input: Record<string, any>): Promise<TransactionResult> {
    const actions = await this.actions(input, WRITE_KINDS);
    // The items as they are, to undo the actions applied when one is refused.
    const before = await Promise.all(actions.map((a) => this.read(a.tableName, a.key)));
    const reasons: Array<Record<string, unknown>> = [];
    let invalid: TaskError | undefined;
    for (const [i, a] of actions.entries()) {
      try {
        await this.store.call(...itemCall(a.kind, a.body, a.key));
        reasons.push({ Code: 'None' });
      } catch (e) {
        const err = e as TaskError;
        if (err.name === 'ConditionalCheckFailedException') {
          const old = before[i];
          const wantsItem = a.body.ReturnValuesOnConditionCheckFailure === 'ALL_OLD' && old !== undefined;
          reasons.push({ Code: 'ConditionalCheckFailed', Message: 'The conditional request failed', ...(wantsItem ? { Item: old } : {}) });
        } else {
          invalid = err;
          break;
        }
      }
    }
    const refused = invalid !== undefined || reasons.some((r) => r.Code !== 'None');
    // Undo: every item a refused transaction touched, and the items a condition check touched.
    const after = await Promise.all(actions.map((a) => this.read(a.tableName, a.key)));
    for (const [i, a] of actions.entries()) {
      if (!refused && a.kind !== 'ConditionCheck') continue;
      if (JSON.stringify(after[i]) === JSON.stringify(before[i])) continue;
      if (before[i] === undefined) await this.store.call('DeleteItem', { TableName: a.tableName, Key: a.key });
      else await this.store.call('PutItem', { TableName: a.tableName, Item: before[i] });
    }
    // Each item is billed twice (prepare and commit) by the larger of its sizes. A cancelled transaction
    // is billed the same, by its items as they are, as a refused condition is (an assumption: AWS does not
    // document whether a cancelled transaction pays its commit phase; billing it whole errs on the high side).
    const items = await Promise.all(
      actions.map(async (a, i) => {
        const bytes = Math.max(sizeOf(before[i]), refused || a.kind === 'ConditionCheck' ? 0 : sizeOf(after[i]));
        return { partition: await this.store.partitionOf(a.tableName, a.key), write: 2 * writeUnits(bytes), read: 0, bytes };
      }),
    );
    if (invalid !== undefined) throw invalid;
    if (refused) throw transactionCanceled(reasons, items);
    return { response: withCapacity({}, input, actions, items, 'write'), items };
  }

  private async get(input: Record<string, any>): Promise<TransactionResult> {
    const actions = await this.actions(input, ['Get']);
    const responses: Array<Record<string, unknown>> = [];
    const items: ItemUnits[] = [];
    for (const a of actions) {
      const out = await this.store.call('GetItem', { ...a.body, Key: a.key, ConsistentRead: true });
      responses.push(out.Item === undefined ? {} : { Item: out.Item });
      // Billed twice by the item's size (1 read unit per 4 KB), whatever the projection returns.
      const bytes = sizeOf(await this.read(a.tableName, a.key));
      items.push({ partition: await this.store.partitionOf(a.tableName, a.key), write: 0, read: transactionalReadUnits(bytes), bytes });
    }
    return { response: withCapacity({ Responses: responses }, input, actions, items, 'read'), items };
  }

  /** The request's actions, checked as DynamoDB checks them: 1 to 100, one kind each, no two on one item. */
  private async actions(input: Record<string, any>, kinds: string[]): Promise<Action[]> {
    const list = input.TransactItems;
    if (!Array.isArray(list) || list.length < 1 || list.length > MAX_TRANSACTION_ITEMS) {
      throw new TaskError(
        'ValidationException',
        `1 validation error detected: Value at 'transactItems' failed to satisfy constraint: Member must have length less than or equal to ${MAX_TRANSACTION_ITEMS} and greater than or equal to 1`,
      );
    }
    if (Buffer.byteLength(JSON.stringify(input)) > MAX_TRANSACTION_BYTES) {
      throw new TaskError('ValidationException', 'the simulator refuses a transaction over 4 MB: DynamoDB bounds the aggregate size of its items at 4 MB, which the simulator does not measure');
    }
    const actions: Action[] = [];
    const seen = new Set<string>();
    for (const entry of list) {
      const present = Object.keys(entry ?? {}).filter((k) => entry[k] !== undefined && entry[k] !== null);
      if (present.length !== 1 || !kinds.includes(present[0])) {
        throw new TaskError('ValidationException', `TransactItems can only contain one of ${kinds.join(', ')}`);
      }
      const kind = present[0] as Action['kind'];
      const body = entry[kind] as Record<string, any>;
      const tableName = String(body.TableName);
      const key = kind === 'Put' ? await this.store.keyOf(tableName, body.Item ?? {}) : body.Key;
      if (key === undefined || typeof key !== 'object') throw new TaskError('ValidationException', 'The provided key element does not match the schema');
      const id = itemIdOf(tableName, key);
      if (seen.has(id)) throw new TaskError('ValidationException', 'Transaction request cannot include multiple operations on one item');
      seen.add(id);
      actions.push({ kind, body, tableName, key });
    }
    return actions;
  }

  private async read(tableName: string, key: Record<string, unknown>): Promise<Record<string, unknown> | undefined> {
    const out = await this.store.call('GetItem', { TableName: tableName, Key: key, ConsistentRead: true });
    return out.Item as Record<string, unknown> | undefined;
  }
}

interface Action {
  readonly kind: WriteKind | 'Get';
  readonly body: Record<string, any>;
  readonly tableName: string;
  readonly key: Record<string, unknown>;
}

/** The item call an action runs as. A condition check is an update without an update expression (undone after). */
function itemCall(kind: Action['kind'], body: Record<string, any>, key: Record<string, unknown>): [string, Record<string, any>] {
  const { ReturnValuesOnConditionCheckFailure: _returnValues, ...request } = body;
  switch (kind) {
    case 'Put':
      return ['PutItem', request];
    case 'Update':
      return ['UpdateItem', request];
    case 'Delete':
      return ['DeleteItem', request];
    default:
      return ['UpdateItem', { ...request, Key: key }];
  }
}

/** A transactional read of an item of `bytes`: twice a strongly consistent one, 1 unit per 4 KB, at least 1. */
function transactionalReadUnits(bytes: number): number {
  return 2 * Math.max(1, Math.ceil(bytes / 4096));
}

function sizeOf(item: Record<string, unknown> | undefined): number {
  return item === undefined ? 0 : itemSizeBytes(item);
}

/** A key as one string, whatever the order of its attributes in the request. */
export function keyJson(key: Record<string, unknown>): string {
  return JSON.stringify(Object.entries(key).sort(([a], [b]) => a.localeCompare(b)));
}

/** An item's identity: its table and whole key. */
export function itemIdOf(tableName: string, key: Record<string, unknown>): string {
  return `${tableName}|${keyJson(key)}`;
}

/** The response's ConsumedCapacity, per table, when asked for. */
function withCapacity(
  response: Record<string, unknown>,
  input: Record<string, any>,
  actions: Action[],
  items: ItemUnits[],
  kind: 'read' | 'write',
): Record<string, unknown> {
  if (input.ReturnConsumedCapacity === undefined || input.ReturnConsumedCapacity === 'NONE') return response;
  const perTable = new Map<string, number>();
  actions.forEach((a, i) => perTable.set(a.tableName, (perTable.get(a.tableName) ?? 0) + items[i][kind]));
  const capacity = [...perTable].map(([TableName, units]) => ({
    TableName,
    CapacityUnits: units,
    ...(kind === 'read' ? { ReadCapacityUnits: units } : { WriteCapacityUnits: units }),
  }));
  return { ...response, ConsumedCapacity: capacity };
}
