import {
  BatchGetItemCommand,
  CreateTableCommand,
  DynamoDBClient,
  GetItemCommand,
  TransactGetItemsCommand,
  TransactionCanceledException,
  TransactWriteItemsCommand,
  TransactWriteItemsCommandInput,
  UpdateItemCommand,
} from '@aws-sdk/client-dynamodb';
import { App, Duration, Stack } from 'aws-cdk-lib';
import * as dynamodb from 'aws-cdk-lib/aws-dynamodb';
import * as sfn from 'aws-cdk-lib/aws-stepfunctions';
import * as tasks from 'aws-cdk-lib/aws-stepfunctions-tasks';
import { DynamoTaskRunner, LocalDynamoDb, refuseWhatItCannotRun, seededRandom, Simulator } from '../simulator';
import { logicalId } from './helpers';

/*
 * DynamoDB transactions in the simulator (simulator/transactions.ts): dynalite has none, so the
 * simulator builds them on its item actions and runs each alone. These tests hold it to DynamoDB's
 * documented behaviour: all or nothing, a reason per action when cancelled, no two actions on one
 * item, idempotency by ClientRequestToken, twice the capacity units, and no state in between visible
 * to anyone.
 */

const TABLE = 'Transactions';
let db: LocalDynamoDb;
let client: DynamoDBClient;

beforeAll(async () => {
  db = await LocalDynamoDb.start();
  client = db.client;
  await client.send(
    new CreateTableCommand({
      TableName: TABLE,
      KeySchema: [{ AttributeName: 'pk', KeyType: 'HASH' }],
      AttributeDefinitions: [{ AttributeName: 'pk', AttributeType: 'S' }],
      BillingMode: 'PAY_PER_REQUEST',
    }),
  );
});
afterAll(() => db.stop());

const key = (pk: string) => ({ pk: { S: pk } });
const item = async (pk: string) => (await client.send(new GetItemCommand({ TableName: TABLE, Key: key(pk), ConsistentRead: true }))).Item;
/** Move `n` from item `from` to item `to`, only while `from` keeps at least 0; `from` must exist. */
const move = (from: string, to: string, n = 1): TransactWriteItemsCommandInput => ({
  TransactItems: [
    {
      Update: {
        TableName: TABLE,
        Key: key(from),
        UpdateExpression: 'SET v = v - :n',
        ConditionExpression: 'v >= :n',
        ExpressionAttributeValues: { ':n': { N: String(n) } },
        ReturnValuesOnConditionCheckFailure: 'ALL_OLD',
      },
    },
    { Update: { TableName: TABLE, Key: key(to), UpdateExpression: 'ADD v :n', ExpressionAttributeValues: { ':n': { N: String(n) } } } },
  ],
});
const put = (pk: string, v: number) => client.send(new UpdateItemCommand({ TableName: TABLE, Key: key(pk), UpdateExpression: 'SET v = :v', ExpressionAttributeValues: { ':v': { N: String(v) } } }));

describe('TransactWriteItems, through the SDK', () => {
  test('all or nothing: a refused condition cancels every action, with a reason per action in order', async () => {
    await put('a', 2);
    await client.send(new TransactWriteItemsCommand(move('a', 'b', 2)));
    expect([await item('a'), await item('b')]).toEqual([{ pk: { S: 'a' }, v: { N: '0' } }, { pk: { S: 'b' }, v: { N: '2' } }]);

    const refused = await client.send(new TransactWriteItemsCommand(move('a', 'b', 1))).catch((e) => e);
    expect(refused).toBeInstanceOf(TransactionCanceledException);
    expect(refused.message).toBe('Transaction cancelled, please refer cancellation reasons for specific reasons [ConditionalCheckFailed, None]');
    expect(refused.CancellationReasons).toEqual([
      { Code: 'ConditionalCheckFailed', Message: 'The conditional request failed', Item: { pk: { S: 'a' }, v: { N: '0' } } },
      { Code: 'None' },
    ]);
    // The second action, which alone would have passed, was not applied either.
    expect((await item('b'))?.v).toEqual({ N: '2' });
  });

  test('a condition check changes nothing, also on a missing item; Put and Delete take part', async () => {
    await put('c', 1);
    await put('c2', 1);
    await client.send(
      new TransactWriteItemsCommand({
        TransactItems: [
          { ConditionCheck: { TableName: TABLE, Key: key('no-such-item'), ConditionExpression: 'attribute_not_exists(pk)' } },
          { ConditionCheck: { TableName: TABLE, Key: key('c'), ConditionExpression: 'v = :one', ExpressionAttributeValues: { ':one': { N: '1' } } } },
          { Put: { TableName: TABLE, Item: { pk: { S: 'new' }, v: { N: '7' } }, ConditionExpression: 'attribute_not_exists(pk)' } },
          { Delete: { TableName: TABLE, Key: key('c2') } },
        ],
      }),
    );
    expect(await item('no-such-item')).toBeUndefined();
    expect((await item('c'))?.v).toEqual({ N: '1' });
    expect(await item('c2')).toBeUndefined();
    expect((await item('new'))?.v).toEqual({ N: '7' });

    // Refused by its last action: the Put and the Delete before it are undone.
    await put('d', 1);
    const refused = await client
      .send(
        new TransactWriteItemsCommand({
          TransactItems: [
            { Put: { TableName: TABLE, Item: { pk: { S: 'e' }, v: { N: '1' } } } },
            { Delete: { TableName: TABLE, Key: key('d') } },
            { ConditionCheck: { TableName: TABLE, Key: key('new'), ConditionExpression: 'v = :zero', ExpressionAttributeValues: { ':zero': { N: '0' } } } },
          ],
        }),
      )
      .catch((e) => e);
    expect(refused.CancellationReasons.map((r: { Code: string }) => r.Code)).toEqual(['None', 'None', 'ConditionalCheckFailed']);
    expect([await item('e'), (await item('d'))?.v, (await item('new'))?.v]).toEqual([undefined, { N: '1' }, { N: '7' }]);
  });

  test('refused as DynamoDB refuses them: two actions on one item, none or more than 100, a malformed action (and nothing applied)', async () => {
    await put('f', 5);
    const twice = { TransactItems: [...move('f', 'g').TransactItems!, { ConditionCheck: { TableName: TABLE, Key: key('f'), ConditionExpression: 'attribute_exists(pk)' } }] };
    await expect(client.send(new TransactWriteItemsCommand(twice))).rejects.toMatchObject({
      name: 'ValidationException',
      message: 'Transaction request cannot include multiple operations on one item',
    });
    await expect(client.send(new TransactWriteItemsCommand({ TransactItems: [] }))).rejects.toMatchObject({ name: 'ValidationException' });
    const many = Array.from({ length: 101 }, (_, i) => ({ Put: { TableName: TABLE, Item: { pk: { S: `many-${i}` } } } }));
    await expect(client.send(new TransactWriteItemsCommand({ TransactItems: many }))).rejects.toMatchObject({ name: 'ValidationException' });
    // An update expression DynamoDB rejects: the whole request fails with it, and the action before it is undone.
    const malformed = {
      TransactItems: [
        { Put: { TableName: TABLE, Item: { pk: { S: 'h' } } } },
        { Update: { TableName: TABLE, Key: key('f'), UpdateExpression: 'SET v = missing + :one', ExpressionAttributeValues: { ':one': { N: '1' } } } },
      ],
    };
    await expect(client.send(new TransactWriteItemsCommand(malformed))).rejects.toMatchObject({ name: 'ValidationException' });
    expect([await item('g'), await item('h'), (await item('f'))?.v]).toEqual([undefined, undefined, { N: '5' }]);
  });

  test('ClientRequestToken: a repeat within ten minutes is answered without being applied again; another request with it is refused', async () => {
    await put('i', 10);
    const request = { ...move('i', 'j', 3), ClientRequestToken: 'token-1' };
    await client.send(new TransactWriteItemsCommand(request));
    await client.send(new TransactWriteItemsCommand(request));
    expect([(await item('i'))?.v, (await item('j'))?.v]).toEqual([{ N: '7' }, { N: '3' }]);
    await expect(client.send(new TransactWriteItemsCommand({ ...move('i', 'j', 1), ClientRequestToken: 'token-1' }))).rejects.toMatchObject({
      name: 'IdempotentParameterMismatchException',
    });
    // The SDK gives every call a token of its own: two calls are two transactions.
    await client.send(new TransactWriteItemsCommand(move('i', 'j', 3)));
    await client.send(new TransactWriteItemsCommand(move('i', 'j', 3)));
    expect([(await item('i'))?.v, (await item('j'))?.v]).toEqual([{ N: '1' }, { N: '9' }]);
  });

  test('nobody sees a transaction half done: 60 transfers at once beside 60 batch reads, the sum always the same', async () => {
    await put('x', 60);
    await put('y', 0);
    const sums: number[] = [];
    const read = async () => {
      const out = await client.send(new BatchGetItemCommand({ RequestItems: { [TABLE]: { Keys: [key('x'), key('y')], ConsistentRead: true } } }));
      sums.push(out.Responses![TABLE].reduce((n, i) => n + Number(i.v.N), 0));
    };
    await Promise.all(Array.from({ length: 60 }, () => [client.send(new TransactWriteItemsCommand(move('x', 'y'))), read()]).flat());
    expect(sums).toHaveLength(60);
    expect(new Set(sums)).toEqual(new Set([60]));
    expect([(await item('x'))?.v, (await item('y'))?.v]).toEqual([{ N: '0' }, { N: '60' }]);
  });
});

describe('TransactGetItems', () => {
  test('reads every item at once, an empty response for a missing one', async () => {
    await put('r1', 1);
    const out = await client.send(
      new TransactGetItemsCommand({
        TransactItems: [{ Get: { TableName: TABLE, Key: key('r1') } }, { Get: { TableName: TABLE, Key: key('r-missing') } }],
      }),
    );
    expect(out.Responses).toEqual([{ Item: { pk: { S: 'r1' }, v: { N: '1' } } }, {}]);
  });
});

describe('capacity', () => {
  const now = Date.parse('2026-01-01T00:00:00Z');
  const transact = 'arn:aws:states:::aws-sdk:dynamodb:transactWriteItems';

  test('each item is billed twice by the larger of its sizes, a cancelled transaction by its items as they are', async () => {
    const runner = new DynamoTaskRunner(db, seededRandom(1), async () => undefined, {}, {}, () => now);
    const units: number[] = [];
    await put('cap-a', 1);
    const big = { TableName: TABLE, Item: { pk: { S: 'cap-b' }, big: { S: 'x'.repeat(1500) } } };
    await runner.run(transact, { TransactItems: [{ Put: big }, { Update: move('cap-a', 'cap-c').TransactItems![0].Update }] }, (u) => units.push(u.write));
    await expect(
      runner.run(transact, { TransactItems: [{ Put: { ...big, ConditionExpression: 'attribute_not_exists(pk)' } }] }, (u) => units.push(u.write)),
    ).rejects.toMatchObject({ name: 'DynamoDb.TransactionCanceledException', message: expect.stringMatching(/\[ConditionalCheckFailed\]$/) });
    // 2 x 2 units for the 1.5 KB item, 2 x 1 for the small one; cancelled: 2 x 2 for the item as it is.
    expect(units).toEqual([6, 4]);
    expect(runner.writeUnits).toBe(10);
  });

  test('an item\'s partition over its rate cancels the transaction (ThrottlingError), applies nothing, and bills nothing', async () => {
    const runner = new DynamoTaskRunner(db, seededRandom(1), async () => undefined, {}, { partitionLimits: true }, () => now);
    await put('hot', 0);
    // About 100 KB: 100 write units a write, 200 in a transaction.
    const hot = (n: number) => ({ Update: { TableName: TABLE, Key: key('hot'), UpdateExpression: 'SET big = :big', ExpressionAttributeValues: { ':big': { S: 'x'.repeat(100 * 1024 - 100 - n) } } } });
    for (let i = 0; i < 5; i++) await runner.run(transact, { TransactItems: [hot(i)] });
    expect(runner.writeUnits).toBe(1000);
    const cold = { Update: { TableName: TABLE, Key: key('cold'), UpdateExpression: 'ADD v :one', ExpressionAttributeValues: { ':one': { N: '1' } } } };
    await expect(runner.run(transact, { TransactItems: [cold, hot(9)] })).rejects.toMatchObject({
      name: 'DynamoDb.TransactionCanceledException',
      message: 'Transaction cancelled, please refer cancellation reasons for specific reasons [None, ThrottlingError]',
    });
    expect([runner.writeUnits, runner.capacityThrottled, await item('cold')]).toEqual([1000, 1, undefined]);
  });
});

describe('conflicts (transactionMillis)', () => {
  const transact = 'arn:aws:states:::aws-sdk:dynamodb:transactWriteItems';
  const add = (pk: string) => ({ Update: { TableName: TABLE, Key: key(pk), UpdateExpression: 'ADD v :one', ExpressionAttributeValues: { ':one': { N: '1' } } } });

  test('while a transaction is under way, a write of its items is refused (TransactionConflictException) and a transaction with one is cancelled (TransactionConflict); nothing refused is applied or billed', async () => {
    let now = Date.parse('2026-01-01T00:00:00Z');
    // The first transaction's time passes only when the test says so; later ones take none.
    let pass: () => void = () => undefined;
    let holding = true;
    const sleep = () => (holding ? new Promise<void>((resolve) => (pass = resolve)) : Promise.resolve());
    const runner = new DynamoTaskRunner(db, seededRandom(1), sleep, {}, {}, () => now, 20);
    await put('tc-a', 0);
    const first = runner.run(transact, { TransactItems: [add('tc-a'), add('tc-b')] });
    while ((await item('tc-b')) === undefined) await new Promise((resolve) => setTimeout(resolve, 1));
    const units = runner.writeUnits;
    // Under way: its items refuse a single write (either integration's name) and another transaction.
    await expect(runner.run('arn:aws:states:::dynamodb:updateItem', add('tc-a').Update)).rejects.toMatchObject({ name: 'DynamoDB.TransactionConflictException' });
    await expect(runner.run('arn:aws:states:::aws-sdk:dynamodb:putItem', { TableName: TABLE, Item: { pk: { S: 'tc-b' }, v: { N: '9' } } })).rejects.toMatchObject({
      name: 'DynamoDb.TransactionConflictException',
      message: 'Operation was rejected because there is an ongoing transaction for the item.',
    });
    await expect(runner.run(transact, { TransactItems: [add('tc-c'), add('tc-b')] })).rejects.toMatchObject({
      name: 'DynamoDb.TransactionCanceledException',
      message: 'Transaction cancelled, please refer cancellation reasons for specific reasons [None, TransactionConflict]',
    });
    // Other items are free, and reads are never refused.
    await runner.run('arn:aws:states:::dynamodb:updateItem', add('tc-d').Update);
    expect(await runner.run('arn:aws:states:::dynamodb:getItem', { TableName: TABLE, Key: key('tc-a'), ConsistentRead: true })).toMatchObject({ Item: { v: { N: '1' } } });
    expect([runner.conflicts, runner.writeUnits - units]).toEqual([3, 1]);
    expect([await item('tc-a'), await item('tc-b'), await item('tc-c')]).toEqual([{ pk: { S: 'tc-a' }, v: { N: '1' } }, { pk: { S: 'tc-b' }, v: { N: '1' } }, undefined]);
    // Its time passed: it answers, and its items are free again.
    now += 20;
    holding = false;
    pass();
    await first;
    await runner.run('arn:aws:states:::dynamodb:updateItem', add('tc-a').Update);
    await runner.run(transact, { TransactItems: [add('tc-b')] });
    expect([runner.conflicts, (await item('tc-a'))?.v, (await item('tc-b'))?.v]).toEqual([3, { N: '2' }, { N: '2' }]);
  });

  test('a TransactGetItems under way cancels transactions on its items, but not single writes', async () => {
    const now = Date.parse('2026-01-01T00:00:00Z');
    let pass: () => void = () => undefined;
    let asleep = false;
    // The read's time passes when the test says so; a transaction after it takes none.
    const sleep = () => (asleep ? Promise.resolve() : new Promise<void>((resolve) => ((asleep = true), (pass = resolve))));
    const runner = new DynamoTaskRunner(db, seededRandom(1), sleep, {}, {}, () => now, 20);
    await put('tg-a', 0);
    const reading = runner.run('arn:aws:states:::aws-sdk:dynamodb:transactGetItems', { TransactItems: [{ Get: { TableName: TABLE, Key: key('tg-a') } }] });
    while (!asleep) await new Promise((resolve) => setTimeout(resolve, 1));
    await runner.run('arn:aws:states:::dynamodb:updateItem', add('tg-a').Update);
    await expect(runner.run(transact, { TransactItems: [add('tg-a')] })).rejects.toMatchObject({ message: expect.stringMatching(/\[TransactionConflict\]$/) });
    pass();
    await expect(reading).resolves.toMatchObject({ Responses: [{ Item: { v: { N: '0' } } }] });
    expect([runner.conflicts, (await item('tg-a'))?.v]).toEqual([1, { N: '1' }]);
  });
});

describe('in a state machine', () => {
  test('the AWS SDK integration runs transactions; a cancelled one fails the task with DynamoDb.TransactionCanceledException', async () => {
    const stack = new Stack(new App(), 'Sim');
    const table = new dynamodb.Table(stack, 'Table', { partitionKey: { name: 'pk', type: dynamodb.AttributeType.STRING } });
    const transfer = new tasks.CallAwsService(stack, 'Transfer', {
      service: 'dynamodb',
      action: 'transactWriteItems',
      parameters: {
        TransactItems: [
          { Put: { TableName: table.tableName, Item: { pk: { S: 'order-1' } }, ConditionExpression: 'attribute_not_exists(pk)' } },
          { Update: { TableName: table.tableName, Key: { pk: { S: 'count' } }, UpdateExpression: 'ADD n :one', ExpressionAttributeValues: { ':one': { N: '1' } } } },
        ],
      },
      iamResources: [table.tableArn],
      resultPath: sfn.JsonPath.DISCARD,
    });
    const read = new tasks.CallAwsService(stack, 'Read', {
      service: 'dynamodb',
      action: 'transactGetItems',
      parameters: { TransactItems: [{ Get: { TableName: table.tableName, Key: { pk: { S: 'count' } } } }] },
      iamResources: [table.tableArn],
      resultSelector: { count: sfn.JsonPath.stringAt('$.Responses[0].Item.n.N') },
      resultPath: '$.read',
    });
    transfer.addCatch(read, { errors: ['DynamoDb.TransactionCanceledException'], resultPath: '$.error' });
    const sm = new sfn.StateMachine(stack, 'Machine', { definitionBody: sfn.DefinitionBody.fromChainable(transfer.next(read)) });
    const sim = await Simulator.start(stack);
    try {
      const machine = sim.stateMachine(logicalId(sm.node.defaultChild as any));
      const first = await sim.startExecution(machine, {}).done;
      expect(first.output).toEqual({ read: { count: '1' } });
      const second = await sim.startExecution(machine, {}).done;
      expect(second.output).toEqual({
        error: { Error: 'DynamoDb.TransactionCanceledException', Cause: 'Transaction cancelled, please refer cancellation reasons for specific reasons [ConditionalCheckFailed, None]' },
        read: { count: '1' },
      });
      expect(first.dynamoCalls + second.dynamoCalls).toBe(4);
    } finally {
      await sim.stop();
    }
  });

  test('an injected conflict (dynamoFaults.transactionConflictRate) cancels a transaction with TransactionConflict and applies nothing; Retry sees it', async () => {
    const stack = new Stack(new App(), 'Sim');
    const table = new dynamodb.Table(stack, 'Table', { partitionKey: { name: 'pk', type: dynamodb.AttributeType.STRING } });
    const count = new tasks.CallAwsService(stack, 'Count', {
      service: 'dynamodb',
      action: 'transactWriteItems',
      parameters: {
        TransactItems: [
          { Update: { TableName: table.tableName, Key: { pk: { S: 'a' } }, UpdateExpression: 'ADD n :one', ExpressionAttributeValues: { ':one': { N: '1' } } } },
          { Update: { TableName: table.tableName, Key: { pk: { S: 'b' } }, UpdateExpression: 'ADD n :one', ExpressionAttributeValues: { ':one': { N: '1' } } } },
        ],
      },
      iamResources: [table.tableArn],
    }).addRetry({ errors: ['DynamoDb.TransactionCanceledException'], interval: Duration.seconds(1), maxAttempts: 2 });
    const sm = new sfn.StateMachine(stack, 'Machine', { definitionBody: sfn.DefinitionBody.fromChainable(count) });
    const sim = await Simulator.start(stack, { dynamoFaults: { transactionConflictRate: 1 } });
    try {
      const e = await sim.startExecution(sim.stateMachine(logicalId(sm.node.defaultChild as any)), {}).done;
      expect(e.status).toBe('FAILED');
      expect(e.error).toBe('DynamoDb.TransactionCanceledException');
      expect(e.cause).toMatch(/^Transaction cancelled, please refer cancellation reasons for specific reasons \[(TransactionConflict, None|None, TransactionConflict)\]$/);
      // Tried three times (two retries), applied never.
      expect(e.dynamoCalls).toBe(3);
      expect(await sim.scan(logicalId(table.node.defaultChild as any))).toEqual([]);
    } finally {
      await sim.stop();
    }
  });

  test('PartiQL is still refused, naming the state', () => {
    const definition = { StartAt: 'S', States: { S: { Type: 'Task', Resource: 'arn:aws:states:::aws-sdk:dynamodb:executeStatement', End: true } } };
    expect(() => refuseWhatItCannotRun('Machine', definition)).toThrow(/state 'S': DynamoDB executeStatement \(PartiQL\): the simulator's DynamoDB has no such action/);
    const transaction = { StartAt: 'S', States: { S: { Type: 'Task', Resource: 'arn:aws:states:::aws-sdk:dynamodb:transactWriteItems', End: true } } };
    expect(() => refuseWhatItCannotRun('Machine', transaction)).not.toThrow();
  });
});
