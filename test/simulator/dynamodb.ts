import { AddressInfo } from 'net';
import * as ddb from '@aws-sdk/client-dynamodb';
import { CfnTemplate } from './cfn';
import { chance, Random } from './random';

// dynalite has no type declarations.
// eslint-disable-next-line @typescript-eslint/no-require-imports
const dynalite = require('dynalite') as (options: Record<string, unknown>) => import('http').Server;

type AnyCommand = new (input: unknown) => Parameters<ddb.DynamoDBClient['send']>[0];

/** Actions of the optimized integration; the AWS SDK integration takes any. */
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
}

/** A running dynalite server and a client for it. */
export class LocalDynamoDb {
  /** Start dynalite on a free port of 127.0.0.1. */
  public static async start(): Promise<LocalDynamoDb> {
    const server = dynalite({ createTableMs: 0, deleteTableMs: 0, updateTableMs: 0 });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', () => resolve()));
    const { port } = server.address() as AddressInfo;
    return new LocalDynamoDb(server, `http://127.0.0.1:${port}`);
  }

  public readonly client: ddb.DynamoDBClient;

  private constructor(
    private readonly server: import('http').Server,
    /** Endpoint URL, for SDK clients of code under test. */
    public readonly endpoint: string,
  ) {
    this.client = new ddb.DynamoDBClient({
      endpoint,
      region: 'us-east-1',
      credentials: { accessKeyId: 'local', secretAccessKey: 'local' },
      maxAttempts: 1,
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

  public async stop(): Promise<void> {
    this.client.destroy();
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
  /** Calls rejected by injected throttling. */
  public throttled = 0;

  constructor(
    private readonly db: LocalDynamoDb,
    private readonly random: Random,
    public faults: DynamoFaults = {},
  ) {}

  public async run(resource: string, parameters: Record<string, any>): Promise<unknown> {
    const m = /^arn:aws:states:::(aws-sdk:)?dynamodb:([A-Za-z]+)$/.exec(resource);
    if (!m) {
      throw new Error(`unsupported DynamoDB resource ${resource}`);
    }
    const sdkIntegration = m[1] !== undefined;
    const action = m[2];
    const commandName = `${action[0].toUpperCase()}${action.slice(1)}Command`;
    const Command = (ddb as unknown as Record<string, AnyCommand | undefined>)[commandName];
    if (!Command || (!sdkIntegration && !OPTIMIZED_ACTIONS.includes(action))) {
      throw new Error(`unsupported DynamoDB action ${resource}`);
    }

    this.calls++;
    if (chance(this.random, this.faults.throttleRate ?? 0)) {
      this.throttled++;
      throw errorName(sdkIntegration, 'ProvisionedThroughputExceededException', 'Rate of requests exceeds the allowed throughput (injected)');
    }
    let response: Record<string, unknown>;
    try {
      response = (await this.db.client.send(new Command(parameters))) as unknown as Record<string, unknown>;
    } catch (e) {
      const err = e as Error;
      throw errorName(sdkIntegration, err.name, err.message);
    }
    if (chance(this.random, this.faults.serverErrorAfterWriteRate ?? 0)) {
      throw errorName(sdkIntegration, 'InternalServerError', 'Internal server error after the write was applied (injected)');
    }
    const { $metadata: _, ...output } = response;
    return output;
  }
}

/**
 * The name Step Functions gives a DynamoDB error. Optimized integrations report the Java SDK v1
 * exception (`DynamoDB.ConditionalCheckFailedException`; validation errors as the base class
 * `DynamoDB.AmazonDynamoDBException`); AWS SDK integrations the SDK v2 one (`DynamoDb.` prefix, the
 * base class `DynamoDb.DynamoDbException`).
 */
function errorName(sdkIntegration: boolean, sdkName: string, message: string): TaskError {
  const exception = sdkName === 'InternalServerError' ? 'InternalServerErrorException' : sdkName;
  if (sdkIntegration) {
    return new TaskError(`DynamoDb.${exception === 'ValidationException' ? 'DynamoDbException' : exception}`, message);
  }
  return new TaskError(`DynamoDB.${exception === 'ValidationException' ? 'AmazonDynamoDBException' : exception}`, message);
}
