import * as http from 'http';
import { AddressInfo } from 'net';
import * as ddb from '@aws-sdk/client-dynamodb';
import { CfnTemplate } from './cfn';
import { installExpressionCache } from './expression-cache';
import { chance, Random } from './random';
import { itemIdOf, ItemUnits, transactionCanceled, TransactionResult, Transactions } from './transactions';

// dynalite has no type declarations.
// eslint-disable-next-line @typescript-eslint/no-require-imports
const dynalite = require('dynalite') as (options: Record<string, unknown>) => http.Server;
// eslint-disable-next-line @typescript-eslint/no-require-imports
const dynaliteDb = require('dynalite/db') as { itemSize(item: Record<string, unknown>): number; create(options: Record<string, unknown>): DynaliteStore };

// Each shape of expression parsed once (see expression-cache.ts): before dynalite serves a request.
installExpressionCache();

/** dynalite's database: what its actions read and write. */
interface DynaliteStore {
  getTable(
    name: string,
    checkStatus: boolean,
    done: (err: Error | null, table?: { TableStatus?: string; KeySchema?: Array<{ AttributeName: string; KeyType: string }> }) => void,
  ): void;
}
/** An error dynalite answers with: its HTTP status and the JSON body DynamoDB sends. */
interface DynaliteError {
  readonly statusCode?: number;
  readonly body?: { readonly __type?: string; readonly message?: string; readonly Message?: string };
}
type DynaliteAction = (store: DynaliteStore, data: unknown, done: (err: DynaliteError | null, result?: unknown) => void) => void;
interface DynaliteValidation {
  readonly types: unknown;
  readonly custom?: unknown;
}
// eslint-disable-next-line @typescript-eslint/no-require-imports
const dynaliteValidations = require('dynalite/validations') as {
  toLowerFirst(action: string): string;
  checkTypes(data: unknown, types: unknown): unknown;
  checkValidations(data: unknown, types: unknown, custom: unknown, store: DynaliteStore): void;
};
/**
 * The actions dynalite serves (its `validOperations`), each with its checks and its code, loaded here
 * so that a dynalite whose files moved fails loudly at load (dynalite is pinned exactly for this).
 * Any other action is refused as its server refuses it.
 */
const DYNALITE_ACTIONS = new Map(
  [
    'BatchGetItem',
    'BatchWriteItem',
    'CreateTable',
    'DeleteItem',
    'DeleteTable',
    'DescribeTable',
    'DescribeTimeToLive',
    'GetItem',
    'ListTables',
    'PutItem',
    'Query',
    'Scan',
    'TagResource',
    'UntagResource',
    'ListTagsOfResource',
    'UpdateItem',
    'UpdateTable',
  ].map((action) => {
    // Named as dynalite's server names them.
    const name = dynaliteValidations.toLowerFirst(action);
    // eslint-disable-next-line @typescript-eslint/no-require-imports
    return [action, { validation: require(`dynalite/validations/${name}`) as DynaliteValidation, act: require(`dynalite/actions/${name}`) as DynaliteAction }];
  }),
);

/**
 * An item's size as DynamoDB counts it: the lengths of its attribute names plus the sizes of their
 * values (https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/CapacityUnitCalculations.html).
 */
export function itemSizeBytes(item: Record<string, unknown>): number {
  return dynaliteDb.itemSize(item);
}

/** Write units of a write on an item of `bytes` (the larger of its sizes before and after): 1 per KB, at least 1. */
export function writeUnits(bytes: number): number {
  return Math.max(1, Math.ceil(bytes / 1024));
}

/** Actions of the optimized integration; the AWS SDK integration takes any that dynalite has. */
const OPTIMIZED_ACTIONS = ['getItem', 'putItem', 'updateItem', 'deleteItem'];

/** An error with an exact AWS error name, as Retry and Catch see it. */
export class TaskError extends Error {
  constructor(name: string, message: string) {
    super(message);
    this.name = name;
  }
}

/** Faults injected into DynamoDB calls made by state machine tasks. */
export interface DynamoFaults {
  /** Probability that a call is rejected with ProvisionedThroughputExceeded (not applied). @default 0 */
  readonly throttleRate?: number;
  /**
   * Probability that a call fails with InternalServerError after it was applied (the ambiguous case: the
   * caller cannot tell whether the write landed). @default 0
   */
  readonly serverErrorAfterWriteRate?: number;
  /**
   * Each call reaches DynamoDB after a random delay of up to this many simulated seconds. With aborts,
   * this opens the late-acquire race: the write of a stopped execution lands after its cleanup ran.
   * @default 0
   */
  readonly maxLatencySeconds?: number;
  /**
   * Probability that a transaction (TransactWriteItems, TransactGetItems) is cancelled as one that met a
   * concurrent transaction or write on one of its items: `TransactionCanceledException`, that item's
   * reason `TransactionConflict`, nothing applied. Without `transactionMillis` a transaction takes no
   * time here and meets no conflict of its own: this is how a workflow's handling of them is tested
   * then. @default 0
   */
  readonly transactionConflictRate?: number;
}

/**
 * DynamoDB's capacity rules, as it bills and throttles on-demand tables: a write costs 1 write unit
 * per KB of the larger of the item's sizes before and after it (a refused condition is billed too, by
 * the item's size), a strongly consistent read 1 read unit per 4 KB (half that eventually consistent),
 * a transactional write twice; and one partition serves at most 1,000 write units and 3,000 read
 * units a second, throttling beyond (ProvisionedThroughputExceeded, not applied). One partition key
 * value is one partition here: items that share it (a table with a sort key) share its rates, and a hot
 * key is never split. Queries and scans are billed but not throttled.
 * https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/read-write-operations.html
 * https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/bp-partition-key-design.html
 */
export interface CapacityOptions {
  /** Throttle a partition key beyond the per-partition rates. @default false */
  readonly partitionLimits?: boolean;
  /** @default 1000 */
  readonly writeUnitsPerSecond?: number;
  /** @default 3000 */
  readonly readUnitsPerSecond?: number;
}

/** Capacity units one call consumed. */
export interface ConsumedUnits {
  readonly write: number;
  readonly read: number;
}

/**
 * A local server of the simulator keeps its clients' idle keep-alive connections open until it stops.
 * Node closes them after 5 s by default, and a client that sends a request on a connection just as
 * the server closes it gets "socket hang up" (ECONNRESET): a fault of the simulation, not of DynamoDB
 * or Step Functions, which would fail the code under test at random.
 */
export function keepIdleConnections(server: http.Server): void {
  server.keepAliveTimeout = 0;
}

/** A read that asks for no strong consistency: `ConsistentRead` not true (a query of an index never is). */
export function eventuallyConsistentRead(action: string, input: Record<string, any>): boolean {
  if (action === 'BatchGetItem') return Object.values<any>(input.RequestItems ?? {}).some((r) => r?.ConsistentRead !== true);
  return ['GetItem', 'Query', 'Scan'].includes(action) && input.ConsistentRead !== true;
}

/**
 * The DynamoDB endpoint of the code under test (Lambda functions, and the SDK clients of the process):
 * its item calls go through the capacity model as the tasks' do (billed, and throttled beyond a
 * partition's rate, with DynamoDB's own error names), but not through the tasks' injected faults
 * (`dynamoFaults`). With `staleReads` on, it refuses an eventually consistent read, loudly, with a
 * ValidationException naming the gap: DynamoDB may answer such a read with an item's previous version
 * ("the response might not reflect the results of a recently completed write operation",
 * https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/HowItWorks.ReadConsistency.html),
 * and dynalite always answers with the latest, so code that passed here could fail on AWS. Other
 * requests (table management) pass straight to dynalite.
 */
export class CodeDynamoDbEndpoint {
  public static async start(db: LocalDynamoDb, runner: DynamoTaskRunner, refuseEventualReads: boolean): Promise<CodeDynamoDbEndpoint> {
    const endpoint = new CodeDynamoDbEndpoint(new URL(db.endpoint), runner, refuseEventualReads);
    keepIdleConnections(endpoint.server);
    await new Promise<void>((resolve) => endpoint.server.listen(0, '127.0.0.1', () => resolve()));
    return endpoint;
  }

  /** The reads refused (`staleReads`): action and table. */
  public readonly refused: Array<{ action: string; tableName: string }> = [];
  /** Item calls served through the capacity model. */
  public calls = 0;
  private readonly server: http.Server;

  private constructor(target: URL, runner: DynamoTaskRunner, refuseEventualReads: boolean) {
    this.server = http.createServer((req, res) => {
      const chunks: Buffer[] = [];
      req.on('data', (c: Buffer) => chunks.push(c));
      req.on('end', () => {
        const body = Buffer.concat(chunks);
        const action = String(req.headers['x-amz-target'] ?? '').split('.').pop() ?? '';
        let input: Record<string, any> | undefined;
        try {
          input = JSON.parse(body.toString() || '{}');
        } catch {
          input = undefined;
        }
        if (input !== undefined && refuseEventualReads && eventuallyConsistentRead(action, input)) {
          const tableName = String(input.TableName ?? Object.keys(input.RequestItems ?? {}).join(', '));
          this.refused.push({ action, tableName });
          replyError(
            res,
            new TaskError(
              'ValidationException',
              `the simulator refuses an eventually consistent ${action} on ${tableName} (staleReads is on): DynamoDB may answer it ` +
                "with the previous version of an item, and the simulator's DynamoDB (dynalite) cannot. Set ConsistentRead: true, or test this read on AWS",
            ),
          );
          return;
        }
        if (input !== undefined && ITEM_ACTIONS.includes(action)) {
          this.calls++;
          runner.call(action, input, { faults: false }).then(
            (response) => reply(res, 200, response),
            (e: Error) => replyError(res, e),
          );
          return;
        }
        const upstream = http.request({ host: target.hostname, port: target.port, method: req.method, path: req.url, headers: req.headers }, (up) => {
          res.writeHead(up.statusCode!, up.headers);
          up.pipe(res);
        });
        upstream.on('error', () => res.destroy());
        upstream.end(body);
      });
    });
  }

  /** Endpoint URL for the code under test (`AWS_ENDPOINT_URL_DYNAMODB`). */
  public get endpoint(): string {
    return `http://127.0.0.1:${(this.server.address() as AddressInfo).port}`;
  }

  public stop(): Promise<void> {
    this.server.closeAllConnections();
    return new Promise((resolve) => this.server.close(() => resolve()));
  }
}

/** A running dynalite server (for SDK clients of code under test), with an SDK client, and `call`, which serves a request without HTTP. */
export class LocalDynamoDb {
  /** Start dynalite on a free port of 127.0.0.1. */
  public static async start(): Promise<LocalDynamoDb> {
    // The server's database, which `call` serves directly: dynalite creates it inside and does not
    // hand it out, so it is caught on its way.
    const create = dynaliteDb.create;
    let store: DynaliteStore | undefined;
    dynaliteDb.create = (options) => (store = create(options));
    let server: http.Server;
    try {
      server = dynalite({ createTableMs: 0, deleteTableMs: 0, updateTableMs: 0 });
    } finally {
      dynaliteDb.create = create;
    }
    if (store === undefined) throw new Error('dynalite no longer creates its database through db.create: the simulator cannot call it directly');
    keepIdleConnections(server);
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', () => resolve()));
    const { port } = server.address() as AddressInfo;
    return new LocalDynamoDb(server, port, store);
  }

  /** Requests dynalite has received, answered or not: `stop()` answers every one of them first. */
  public get requestsReceived(): number {
    return this.received;
  }

  /** Endpoint URL, for SDK clients of code under test (`AWS_ENDPOINT_URL_DYNAMODB`). */
  public readonly endpoint: string;
  /** An SDK client, for tests and tools. */
  public readonly client: ddb.DynamoDBClient;
  /** Requests dynalite has received and not yet answered. */
  private inFlight = 0;
  private received = 0;
  private stopping = false;
  /** Item calls being served: a transaction waits until there are none. */
  private serving = 0;
  /** Whether a transaction runs (item calls wait), the transactions queued behind it, and who waits for either. */
  private transacting = false;
  private exclusive: Promise<void> = Promise.resolve();
  private readonly held: Array<() => void> = [];
  private idle?: () => void;
  private readonly transactions = new Transactions({
    call: (action, input) => this.serve(action, input),
    keyOf: (tableName, item) => this.keyOf(tableName, item),
    partitionOf: (tableName, key) => this.partitionOf(tableName, key),
    now: () => Date.now(),
  });
  private drained?: () => void;
  /** Who hears the keys of the items writes changed (see onItemWritten). */
  private readonly writeListeners: Array<(tableName: string, key: Record<string, unknown>) => void> = [];

  private constructor(
    private readonly server: http.Server,
    port: number,
    private readonly store: DynaliteStore,
  ) {
    this.endpoint = `http://127.0.0.1:${port}`;
    // Item and transaction calls that come over HTTP (tests, the CLI, tools) are served as `call` serves
    // them: through the gate that lets a transaction run alone, and with the transactions dynalite lacks.
    const dynaliteListeners = server.listeners('request') as Array<(req: http.IncomingMessage, res: http.ServerResponse) => void>;
    server.removeAllListeners('request');
    server.on('request', (req: http.IncomingMessage, res: http.ServerResponse) => {
      this.inFlight++;
      this.received++;
      // 'close' follows the answer, or a client that hung up first: either way, never missed.
      res.once('close', () => this.answered());
      const action = String(req.headers['x-amz-target'] ?? '').split('.').pop() ?? '';
      if (!GATED_ACTIONS.includes(action)) {
        for (const listener of dynaliteListeners) listener.call(server, req, res);
        return;
      }
      const chunks: Buffer[] = [];
      req.on('data', (c: Buffer) => chunks.push(c));
      req.on('end', () => {
        let input: unknown;
        try {
          input = JSON.parse(Buffer.concat(chunks).toString() || '{}');
        } catch {
          replyError(res, new TaskError('SerializationException', 'Start of structure or map found where not expected'));
          return;
        }
        this.serveItemOrTransaction(action, input).then((response) => reply(res, 200, response), (e: Error) => replyError(res, e));
      });
    });
    this.client = new ddb.DynamoDBClient({
      endpoint: this.endpoint,
      region: 'us-east-1',
      credentials: { accessKeyId: 'local', secretAccessKey: 'local' },
      maxAttempts: 1,
    });
  }

  /**
   * Call an action the way dynalite's server does, without HTTP: the same JSON request DynamoDB
   * receives, checked by dynalite's own type and validation checks, then its action on the server's
   * database, and the answer as JSON. (An HTTP round trip per call cost the simulated clock: a burst
   * of executions made DynamoDB calls slower than the executions' bodies.) The request and the
   * answer pass through JSON, so neither shares an object with the caller. Throws an error named as
   * the SDK names it (`ConditionalCheckFailedException`, ...).
   */
  public call(action: string, input: unknown): Promise<Record<string, unknown>> {
    // A call after `stop()` (of an execution stopped meanwhile) is refused, as a closed server refused it.
    if (this.stopping) return Promise.reject(new Error(`connect ECONNREFUSED: the simulator's DynamoDB has stopped (${action})`));
    this.inFlight++;
    this.received++;
    return this.serveItemOrTransaction(action, input).finally(() => this.answered());
  }

  private serveItemOrTransaction(action: string, input: unknown): Promise<Record<string, unknown>> {
    if (!TRANSACTION_ACTIONS.includes(action)) return this.gated(action, input);
    return this.alone(action, input as Record<string, any>).then((r) => r.response);
  }

  /**
   * A transaction (TransactWriteItems, TransactGetItems), which dynalite lacks (see transactions.ts):
   * its answer, and the units each of its items consumed. It runs alone: it waits until the calls being
   * served have ended, and calls that come meanwhile wait until it has.
   */
  public transact(action: string, input: Record<string, any>): Promise<TransactionResult> {
    if (this.stopping) return Promise.reject(new Error(`connect ECONNREFUSED: the simulator's DynamoDB has stopped (${action})`));
    this.inFlight++;
    this.received++;
    return this.alone(action, input).finally(() => this.answered());
  }

  private alone(action: string, input: Record<string, any>): Promise<TransactionResult> {
    const run = this.exclusive.then(async () => {
      this.transacting = true;
      if (this.serving > 0) await new Promise<void>((resolve) => (this.idle = resolve));
      try {
        return await this.transactions.serve(action, JSON.parse(JSON.stringify(input ?? {})));
      } finally {
        this.transacting = false;
        for (const resume of this.held.splice(0)) resume();
      }
    });
    this.exclusive = run.then(
      () => undefined,
      () => undefined,
    );
    return run;
  }

  /**
   * Hear the table and key of every item a write has changed from now on (a PutItem, UpdateItem,
   * DeleteItem, BatchWriteItem, or an item of a transaction; a refused write changes nothing), however
   * the write came: so that a watcher can read the items it cares about, not scan a table whose other
   * items (a queue's ticket items) grow in number. Returns the function that stops the listening.
   */
  public onItemWritten(listener: (tableName: string, key: Record<string, unknown>) => void): () => void {
    this.writeListeners.push(listener);
    return () => {
      const at = this.writeListeners.indexOf(listener);
      if (at >= 0) this.writeListeners.splice(at, 1);
    };
  }

  /**
   * Tell the write listeners which items a successful write changed. It never fails the write: a
   * listener that throws is thrown uncaught (loud, as a fault of dynalite's is), and a table gone since
   * the write has no key schema to read (its items are gone with it).
   */
  private async written(action: string, input: Record<string, any>): Promise<void> {
    const tell = (tableName: string, key: Record<string, unknown>) => {
      for (const listener of [...this.writeListeners]) {
        try {
          listener(tableName, key);
        } catch (e) {
          setImmediate(() => {
            throw e;
          });
        }
      }
    };
    const tellItem = async (tableName: string, item: Record<string, unknown>) => {
      const key = await this.keyOf(tableName, item).catch(() => undefined);
      if (key !== undefined) tell(tableName, key);
    };
    if (action === 'UpdateItem' || action === 'DeleteItem') {
      tell(input.TableName, input.Key);
      return;
    }
    if (action === 'PutItem') {
      await tellItem(input.TableName, input.Item);
      return;
    }
    // BatchWriteItem.
    for (const [tableName, requests] of Object.entries(input.RequestItems ?? {}) as Array<[string, Array<Record<string, any>>]>) {
      for (const r of requests) {
        if (r.DeleteRequest) tell(tableName, r.DeleteRequest.Key);
        else if (r.PutRequest) await tellItem(tableName, r.PutRequest.Item);
      }
    }
  }

  /** An item call, once no transaction runs. */
  private async gated(action: string, input: unknown): Promise<Record<string, unknown>> {
    while (this.transacting) await new Promise<void>((resolve) => this.held.push(resolve));
    this.serving++;
    try {
      return await this.serve(action, input);
    } finally {
      this.serving--;
      if (this.serving === 0 && this.idle) {
        const idle = this.idle;
        this.idle = undefined;
        idle();
      }
    }
  }

  /**
   * `call`'s work. dynalite creates a table in the state CREATING and makes it ACTIVE on a timer
   * (`createTableMs`, 0 here: "at once"), and refuses item calls before that, as DynamoDB does
   * ("Requested resource not found"). Over HTTP a call never came that soon; served directly it can,
   * so a call refused while its table was CREATING (it is CREATING or ACTIVE now: the timer may have
   * run since) waits for the timer and is served then.
   */
  private async serve(action: string, input: unknown): Promise<Record<string, unknown>> {
    // The request as it is now, as DynamoDB would receive it: a retry does not see later changes.
    const request = JSON.stringify(input ?? {});
    for (let attempt = 1; ; attempt++) {
      let response: Record<string, unknown>;
      try {
        response = await this.serveOnce(action, request);
      } catch (e) {
        const tableName = (input as { TableName?: unknown } | undefined)?.TableName;
        const created = (e as Error).name === 'ResourceNotFoundException' && typeof tableName === 'string' && attempt < 100;
        if (!created || !['CREATING', 'ACTIVE'].includes((await this.tableStatus(tableName)) ?? '')) throw e;
        await new Promise((resolve) => setTimeout(resolve, 1));
        continue;
      }
      // The write has landed: nothing after this point may fail it, or have it made twice.
      if (this.writeListeners.length > 0 && WRITE_LISTENED_ACTIONS.includes(action)) await this.written(action, JSON.parse(request));
      return response;
    }
  }

  /** An item's key, by its table's key schema. */
  public async keyOf(tableName: string, item: Record<string, unknown>): Promise<Record<string, unknown>> {
    const names = await this.keySchema(tableName);
    return Object.fromEntries(names.map((name) => [name, item[name]]));
  }

  /**
   * The partition an item goes to, for the capacity model: its table and its partition key's value. Items
   * that share a partition key (a table with a sort key) share a partition, and its 1,000 write and 3,000
   * read units a second; a hot partition key is never split here.
   */
  public async partitionOf(tableName: string, key: Record<string, unknown>): Promise<string> {
    const [partitionKey] = await this.keySchema(tableName);
    return `${tableName}|${JSON.stringify({ [partitionKey]: key[partitionKey] })}`;
  }

  /** The names of a table's key attributes, the partition key first. */
  private keySchema(tableName: string): Promise<string[]> {
    return new Promise((resolve, reject) =>
      this.store.getTable(tableName, false, (err, table) => {
        if (err || !table?.KeySchema) reject(new TaskError('ResourceNotFoundException', 'Requested resource not found'));
        else resolve([...table.KeySchema].sort((a, b) => (a.KeyType === 'HASH' ? -1 : b.KeyType === 'HASH' ? 1 : 0)).map((k) => k.AttributeName));
      }),
    );
  }

  private tableStatus(tableName: string): Promise<string | undefined> {
    return new Promise((resolve) => this.store.getTable(tableName, false, (err, table) => resolve(err ? undefined : table?.TableStatus)));
  }

  private serveOnce(action: string, request: string): Promise<Record<string, unknown>> {
    return new Promise<Record<string, unknown>>((resolve, reject) => {
      const refuse = (e: DynaliteError) => {
        const body = e.body ?? {};
        reject(new TaskError(String(body.__type ?? 'UnknownError').split('#').pop()!, body.message ?? body.Message ?? ''));
      };
      // An error dynalite does not answer with (a fault of its own, "Database is closed") fails the
      // call and is thrown uncaught as well, as its server throws it: loud, not a task error that a
      // Retry or Catch on States.ALL would hide.
      const fault = (e: unknown) => {
        reject(e);
        setImmediate(() => {
          throw e;
        });
      };
      const served = DYNALITE_ACTIONS.get(action);
      if (served === undefined) {
        refuse({ body: { __type: 'com.amazon.coral.service#UnknownOperationException', message: `unknown action ${action}` } });
        return;
      }
      let data: unknown;
      try {
        data = dynaliteValidations.checkTypes(JSON.parse(request), served.validation.types);
        dynaliteValidations.checkValidations(data, served.validation.types, served.validation.custom, this.store);
      } catch (e) {
        if ((e as DynaliteError).statusCode) refuse(e as DynaliteError);
        else fault(e);
        return;
      }
      served.act(this.store, data, (err, result) => {
        if (err) {
          if (err.statusCode) refuse(err);
          else fault(err);
          return;
        }
        resolve(JSON.parse(JSON.stringify(result ?? {})));
      });
    });
  }

  /** Create every `AWS::DynamoDB::Table` of a template under the names given. */
  public async createTables(template: CfnTemplate, tableNames: Map<string, string>): Promise<void> {
    for (const [logicalId, resource] of Object.entries(template.Resources)) {
      if (resource.Type !== 'AWS::DynamoDB::Table') continue;
      const p = resource.Properties ?? {};
      await this.client.send(
        new ddb.CreateTableCommand({
          TableName: tableNames.get(logicalId)!,
          KeySchema: p.KeySchema,
          AttributeDefinitions: p.AttributeDefinitions,
          BillingMode: 'PAY_PER_REQUEST',
        }),
      );
    }
  }

  private answered(): void {
    this.inFlight--;
    if (this.inFlight === 0) this.drained?.();
  }

  /**
   * Stop the server once every request it received is answered. A request can outlive the
   * execution that sent it (a stopped execution does not wait for its call); dynalite throws an
   * uncaught "Database is closed" if its database closes while such a request waits for the item's
   * lock.
   */
  public async stop(): Promise<void> {
    this.stopping = true;
    if (this.inFlight > 0) await new Promise<void>((resolve) => (this.drained = resolve));
    this.client.destroy();
    // Idle keep-alive connections stay open (keepIdleConnections): close them, or close() would wait.
    this.server.closeAllConnections();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }
}

/**
 * Runs the DynamoDB tasks of state machines against dynalite: the optimized integrations
 * (`arn:aws:states:::dynamodb:getItem|putItem|updateItem|deleteItem`) and the AWS SDK integrations
 * (`arn:aws:states:::aws-sdk:dynamodb:<action>`), raising errors under the names Step Functions gives
 * them, and counting every call.
 */
export class DynamoTaskRunner {
  /** Whether this runner handles a Task resource. */
  public static handles(resource: string): boolean {
    return /^arn:aws:states:::(dynamodb:|aws-sdk:dynamodb:)/.test(resource);
  }

  /** Calls made, faulted ones included. */
  public calls = 0;
  /** Calls rejected by injected throttling, or by a partition over its capacity. */
  public throttled = 0;
  /** Of those, the calls a partition over its capacity rejected. */
  public capacityThrottled = 0;
  /** Write and read units consumed, as DynamoDB bills them. */
  public writeUnits = 0;
  public readUnits = 0;
  /**
   * How long each admitted item call took, in simulated milliseconds, injected latency left out
   * (transactions, which run alone through their own gate, are not timed): the
   * emulator's own time, which grows when the machine cannot keep up with the clock (DynamoDB answers
   * in single-digit milliseconds). See `percentile`.
   */
  public readonly callMillis: number[] = [];
  /**
   * Calls refused because a transaction was under way on one of their items (`transactionMillis`): a
   * write with TransactionConflictException, a transaction cancelled with the reason TransactionConflict.
   */
  public conflicts = 0;
  /** The items transactions are under way on, until when (simulated milliseconds), and whether the transaction writes. */
  private readonly ongoing = new Map<string, { until: number; write: boolean }>();
  /** Per partition key: the simulated second and the units consumed in it, and the units of the key's last write. */
  private readonly partitions = new Map<string, { second: number; write: number; read: number; lastWrite: number }>();

  constructor(
    private readonly db: LocalDynamoDb,
    private readonly random: Random,
    /** Sleeps simulated seconds. */
    private readonly sleep: (seconds: number) => Promise<void>,
    public faults: DynamoFaults = {},
    private readonly capacity: CapacityOptions = {},
    /** The simulated clock, epoch milliseconds. */
    private readonly now: () => number = Date.now,
    /** How long a transaction keeps its items, simulated milliseconds (SimulatorOptions.transactionMillis). */
    private readonly transactionMillis: number = 0,
  ) {}

  /**
   * Run one task's call. `onConsumed` hears the capacity units it consumed (none when it was throttled
   * or failed before DynamoDB decided).
   */
  public async run(resource: string, parameters: Record<string, any>, onConsumed?: (units: ConsumedUnits) => void): Promise<unknown> {
    const m = /^arn:aws:states:::(aws-sdk:)?dynamodb:([A-Za-z]+)$/.exec(resource);
    if (!m || (!m[1] && !OPTIMIZED_ACTIONS.includes(m[2]))) {
      throw new Error(`unsupported DynamoDB resource ${resource}`);
    }
    const sdkIntegration = m[1] !== undefined;
    const action = `${m[2][0].toUpperCase()}${m[2].slice(1)}`;
    try {
      return await this.call(action, parameters, { faults: true, onConsumed });
    } catch (e) {
      const err = e as Error;
      throw errorName(sdkIntegration, err.name, err.message);
    }
  }

  /**
   * One call as DynamoDB serves it: billed and throttled by the capacity model, with the injected
   * `faults` if asked (the tasks' calls; code under test gets the capacity model only). Errors carry
   * DynamoDB's own names (`ConditionalCheckFailedException`, `ProvisionedThroughputExceededException`, ...).
   */
  public async call(
    action: string,
    parameters: Record<string, any>,
    options: { faults: boolean; onConsumed?: (units: ConsumedUnits) => void },
  ): Promise<unknown> {
    this.calls++;
    if (options.faults && chance(this.random, this.faults.throttleRate ?? 0)) {
      this.throttled++;
      throw new TaskError('ProvisionedThroughputExceededException', 'Rate of requests exceeds the allowed throughput (injected)');
    }
    if (options.faults && this.faults.maxLatencySeconds) {
      await this.sleep(this.random() * this.faults.maxLatencySeconds);
    }
    if (TRANSACTION_ACTIONS.includes(action)) return this.transaction(action, parameters, options);
    if (this.transactionMillis > 0 && WRITE_ACTIONS.includes(action)) {
      const item = await this.itemOf(parameters);
      if (item !== undefined && this.underWay(item, true)) {
        this.conflicts++;
        throw new TaskError('TransactionConflictException', 'Operation was rejected because there is an ongoing transaction for the item.');
      }
    }
    const partition = await this.partitionOf(parameters);
    if (partition !== undefined && this.overCapacity(partition, action)) {
      this.throttled++;
      this.capacityThrottled++;
      throw new TaskError('ProvisionedThroughputExceededException', 'The level of configured provisioned throughput for one partition was exceeded (capacity model)');
    }
    // Admitted: the call counts against its partition from now, at the estimate, so that calls in flight
    // at once are not all admitted against the units of the calls completed before them.
    const reservation = partition === undefined ? undefined : this.reserve(partition, WRITE_ACTIONS.includes(action));
    const started = this.now();
    try {
      return await this.admitted(action, parameters, partition, options);
    } finally {
      this.callMillis.push(this.now() - started);
      if (reservation) this.release(reservation);
    }
  }

  /** The call once its partition admitted it. */
  private async admitted(
    action: string,
    parameters: Record<string, any>,
    partition: string | undefined,
    options: { faults: boolean; onConsumed?: (units: ConsumedUnits) => void },
  ): Promise<unknown> {
    const { onConsumed } = options;
    const measured = parameters.ReturnConsumedCapacity === undefined ? { ...parameters, ReturnConsumedCapacity: 'TOTAL' } : parameters;
    let response: Record<string, unknown>;
    try {
      response = await this.db.call(action, measured);
    } catch (e) {
      const err = e as Error;
      if (err.name === 'ConditionalCheckFailedException' && WRITE_ACTIONS.includes(action)) {
        // Billed as a write of the item as it is (a PutItem, which names no key here: as the item it puts).
        const item =
          parameters.Key === undefined
            ? parameters.Item
            : (await this.db.call('GetItem', { TableName: parameters.TableName, Key: parameters.Key, ConsistentRead: true })).Item;
        this.consume(partition, { write: writeUnits(item ? itemSizeBytes(item as Record<string, unknown>) : 0), read: 0 }, onConsumed);
      }
      throw err instanceof TaskError ? err : new TaskError(err.name, err.message);
    }
    const consumed = response.ConsumedCapacity as { CapacityUnits?: number } | Array<{ CapacityUnits?: number }> | undefined;
    if (measured !== parameters) delete response.ConsumedCapacity;
    // A batch reports its capacity per table.
    const units = Array.isArray(consumed) ? consumed.reduce((n, c) => n + (c.CapacityUnits ?? 0), 0) : (consumed?.CapacityUnits ?? 0);
    this.consume(partition, READ_ACTIONS.includes(action) ? { write: 0, read: units } : { write: units, read: 0 }, onConsumed);
    if (options.faults && chance(this.random, this.faults.serverErrorAfterWriteRate ?? 0)) {
      throw new TaskError('InternalServerError', 'Internal server error after the write was applied (injected)');
    }
    return response;
  }

  /**
   * A transaction (transactions.ts): refused as a whole when one of its items' partitions is over its rate
   * (cancelled, that item's reason ThrottlingError, as DynamoDB cancels one it cannot serve), else billed
   * item by item on each item's partition, a cancelled one included.
   */
  private async transaction(
    action: string,
    parameters: Record<string, any>,
    options: { faults: boolean; onConsumed?: (units: ConsumedUnits) => void },
  ): Promise<unknown> {
    const write = action === 'TransactWriteItems';
    // Each action's body: `{ Update: { ... } }` and the like.
    const bodies: Array<Record<string, any> | undefined> = (Array.isArray(parameters.TransactItems) ? parameters.TransactItems : []).map(
      (entry: Record<string, any>) => Object.values(entry ?? {})[0] as Record<string, any> | undefined,
    );
    const partitions = await Promise.all(bodies.map((body) => (body?.Key === undefined ? undefined : this.partitionOf(body))));
    const actions = bodies.length;
    if (options.faults && actions > 0 && chance(this.random, this.faults.transactionConflictRate ?? 0)) {
      const conflicted = Math.floor(this.random() * actions);
      throw transactionCanceled(Array.from({ length: actions }, (_, i) => (i === conflicted ? CONFLICT_REASON : { Code: 'None' })));
    }
    const itemIds = this.transactionMillis > 0 ? await Promise.all(bodies.map((body) => (body === undefined ? undefined : this.itemOf(body)))) : [];
    const conflicting = itemIds.map((item) => item !== undefined && this.underWay(item, false));
    if (conflicting.some((c) => c)) {
      this.conflicts++;
      throw transactionCanceled(conflicting.map((c) => (c ? CONFLICT_REASON : { Code: 'None' })));
    }
    const over = partitions.map((p: string | undefined) => p !== undefined && this.overCapacity(p, write ? 'UpdateItem' : 'GetItem'));
    if (over.some((o: boolean) => o)) {
      this.throttled++;
      this.capacityThrottled++;
      const reasons = over.map((o: boolean) =>
        o
          ? {
            Code: 'ThrottlingError',
            Message: 'Throughput exceeds the current capacity of your table or index. DynamoDB is automatically scaling your table or index so please try again shortly.',
          }
          : { Code: 'None' },
      );
      throw transactionCanceled(reasons);
    }
    // Admitted: each item's partition counts it from now (see call).
    const reservations = partitions.flatMap((p) => (p === undefined ? [] : [this.reserve(p, write)]));
    const bill = (items: ItemUnits[]) => {
      for (const item of items) this.consume(item.partition, { write: item.write, read: item.read }, undefined);
      onConsumedTotal(items, options.onConsumed);
    };
    // Under way from now until transactionMillis have passed: its items refuse other writes and transactions.
    const hold = { until: this.now() + this.transactionMillis, write };
    const held = itemIds.filter((item): item is string => item !== undefined);
    held.forEach((item) => this.ongoing.set(item, hold));
    let result: TransactionResult;
    try {
      result = await this.db.transact(action, parameters);
    } catch (e) {
      const items = (e as { items?: ItemUnits[] }).items;
      if (items) bill(items);
      throw e instanceof TaskError ? e : new TaskError((e as Error).name, (e as Error).message);
    } finally {
      reservations.forEach((r) => this.release(r));
      if (held.length > 0) {
        await this.sleep(this.transactionMillis / 1000);
        for (const item of held) if (this.ongoing.get(item) === hold) this.ongoing.delete(item);
      }
    }
    bill(result.items);
    if (options.faults && chance(this.random, this.faults.serverErrorAfterWriteRate ?? 0) && write) {
      throw new TaskError('InternalServerError', 'Internal server error after the write was applied (injected)');
    }
    return result.response;
  }

  /**
   * The partition a single-item call goes to (table and partition key value; the same string a
   * transaction's items are billed under); undefined for a query, a scan, a transaction, or a PutItem
   * (which names no key), and for a table that does not exist (the call then fails as DynamoDB fails it).
   */
  private async partitionOf(parameters: Record<string, any>): Promise<string | undefined> {
    if (parameters.Key === undefined) return undefined;
    return this.db.partitionOf(parameters.TableName, parameters.Key).catch(() => undefined);
  }

  /**
   * The item a single-item call or a transaction's action names: its table and its whole key (a Put's
   * from its item), in a form that does not depend on the order of the key's attributes; undefined for
   * a table that does not exist (the call then fails as DynamoDB fails it).
   */
  private async itemOf(parameters: Record<string, any>): Promise<string | undefined> {
    const tableName = parameters.TableName;
    const key =
      parameters.Key ?? (parameters.Item === undefined ? undefined : await this.db.keyOf(tableName, parameters.Item).catch(() => undefined));
    return key === undefined || typeof tableName !== 'string' ? undefined : itemIdOf(tableName, key);
  }

  /**
   * Whether a transaction is under way on an item: for a single write, a transaction that writes; for a
   * transaction, any (https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/transaction-apis.html#transaction-conflict-handling).
   */
  private underWay(item: string, byWrite: boolean): boolean {
    const hold = this.ongoing.get(item);
    return hold !== undefined && this.now() < hold.until && (hold.write || !byWrite);
  }

  /** Whether the call would take its partition over its rate this simulated second (a write estimated as the key's last). */
  private overCapacity(partition: string, action: string): boolean {
    if (this.capacity.partitionLimits !== true) return false;
    const p = this.partitionNow(partition);
    if (WRITE_ACTIONS.includes(action)) return p.write + p.lastWrite > (this.capacity.writeUnitsPerSecond ?? 1000);
    return p.read + 1 > (this.capacity.readUnitsPerSecond ?? 3000);
  }

  /**
   * Count an admitted call against its partition until it completes: a write at the units of the key's
   * last write, a read at one unit. DynamoDB admits a request before it knows what it will consume, and
   * debits what it did; the estimate stands in for the calls still in flight.
   */
  private reserve(partition: string, write: boolean): Reservation {
    const p = this.partitionNow(partition);
    const reservation = { partition, second: p.second, write: write ? p.lastWrite : 0, read: write ? 0 : 1 };
    p.write += reservation.write;
    p.read += reservation.read;
    return reservation;
  }

  /** Give back a reservation once its call is done (it consumed what it did, or nothing). Of a past second, nothing is left to give back. */
  private release(reservation: Reservation): void {
    const p = this.partitions.get(reservation.partition);
    if (p === undefined || p.second !== reservation.second) return;
    p.write -= reservation.write;
    p.read -= reservation.read;
  }

  private partitionNow(partition: string): { second: number; write: number; read: number; lastWrite: number } {
    const second = Math.floor(this.now() / 1000);
    let p = this.partitions.get(partition);
    if (p === undefined) {
      p = { second, write: 0, read: 0, lastWrite: 1 };
      this.partitions.set(partition, p);
    } else if (p.second !== second) {
      p.second = second;
      p.write = 0;
      p.read = 0;
    }
    return p;
  }

  private consume(partition: string | undefined, units: ConsumedUnits, onConsumed?: (units: ConsumedUnits) => void): void {
    this.writeUnits += units.write;
    this.readUnits += units.read;
    if (partition !== undefined) {
      const p = this.partitionNow(partition);
      p.write += units.write;
      p.read += units.read;
      if (units.write > 0) p.lastWrite = units.write;
    }
    onConsumed?.(units);
  }
}

/** A transaction's reason for an item another transaction was under way on (injected, or met). */
const CONFLICT_REASON = { Code: 'TransactionConflict', Message: 'Transaction is ongoing for the item' };

/** Units an admitted call counts against its partition while in flight (DynamoTaskRunner.reserve). */
interface Reservation {
  readonly partition: string;
  readonly second: number;
  readonly write: number;
  readonly read: number;
}

/** Tell `onConsumed` the units of a transaction's items, in all. */
function onConsumedTotal(items: ItemUnits[], onConsumed?: (units: ConsumedUnits) => void): void {
  onConsumed?.({ write: items.reduce((n, i) => n + i.write, 0), read: items.reduce((n, i) => n + i.read, 0) });
}

const WRITE_ACTIONS = ['UpdateItem', 'PutItem', 'DeleteItem'];
const READ_ACTIONS = ['GetItem', 'Query', 'Scan', 'BatchGetItem'];
/** The transactions, which the simulator serves itself (transactions.ts). */
const TRANSACTION_ACTIONS = ['TransactWriteItems', 'TransactGetItems'];
/** The actions the capacity model serves for code under test; any other passes straight to dynalite. */
const ITEM_ACTIONS = [...WRITE_ACTIONS, ...READ_ACTIONS, 'BatchWriteItem', ...TRANSACTION_ACTIONS];
/** The writes whose items `onItemWritten` tells (a transaction's items are written by these too, one at a time). */
const WRITE_LISTENED_ACTIONS = [...WRITE_ACTIONS, 'BatchWriteItem'];
/** The actions that wait while a transaction runs (and the transactions): every one that reads or writes items. */
const GATED_ACTIONS = ITEM_ACTIONS;

/** A JSON answer, as DynamoDB's endpoint sends it. */
function reply(res: http.ServerResponse, status: number, body: unknown): void {
  const payload = JSON.stringify(body);
  res.writeHead(status, { 'Content-Type': 'application/x-amz-json-1.0', 'Content-Length': Buffer.byteLength(payload) });
  res.end(payload);
}

/** An error answer, named as DynamoDB names it (a cancelled transaction with its reasons). */
function replyError(res: http.ServerResponse, e: Error): void {
  const reasons = (e as { CancellationReasons?: unknown }).CancellationReasons;
  reply(res, e.name === 'InternalServerError' ? 500 : 400, {
    __type: `com.amazonaws.dynamodb.v20120810#${e.name}`,
    message: e.message,
    ...(reasons === undefined ? {} : { CancellationReasons: reasons }),
  });
}

/**
 * The name Step Functions gives a DynamoDB error. Optimized integrations report the Java SDK v1
 * exception (`DynamoDB.ConditionalCheckFailedException`; validation errors as the base class
 * `DynamoDB.AmazonDynamoDBException`); AWS SDK integrations the SDK v2 one (`DynamoDb.` prefix, the
 * base class `DynamoDb.DynamoDbException`).
 */
function errorName(sdkIntegration: boolean, sdkName: string, message: string): TaskError {
  return new TaskError(stepFunctionsDynamoErrorName(sdkIntegration, sdkName), message);
}

/** The name Step Functions gives the DynamoDB error `sdkName` (as the DynamoDB API names it). */
export function stepFunctionsDynamoErrorName(sdkIntegration: boolean, sdkName: string): string {
  const exception = sdkName === 'InternalServerError' ? 'InternalServerErrorException' : sdkName;
  if (sdkIntegration) return `DynamoDb.${exception === 'ValidationException' ? 'DynamoDbException' : exception}`;
  return `DynamoDB.${exception === 'ValidationException' ? 'AmazonDynamoDBException' : exception}`;
}
