import * as ddb from '@aws-sdk/client-dynamodb';
import * as sfn from '@aws-sdk/client-sfn';
import * as doc from '@aws-sdk/lib-dynamodb';

/*
 * The code that reads and writes locks outside the state machines (the reconciler's sweep and redrive
 * guard, the queue service, the client's release) is written as flows: generator functions that yield
 * each AWS call as an effect and get its answer back. In production `runFlow` makes the calls with the
 * AWS SDK. The protocol checker (checker/) drives the very same flows one call at a time, as atomic
 * steps of its model, so that what it verifies is this code and not a copy of it.
 *
 * A flow must take everything that varies from effects: the time (`clock`) and random ids (`uuid`)
 * included. Replayed with the same answers, it makes the same calls.
 */

export type DynamoDbAction = 'GetItem' | 'UpdateItem' | 'DeleteItem' | 'Scan';
export type DocumentAction = 'Get' | 'Update' | 'Scan';
export type StepFunctionsAction = 'DescribeExecution' | 'StopExecution' | 'SendTaskSuccess' | 'GetExecutionHistory' | 'ListExecutions';

export type Effect =
  /** A DynamoDB call, with AttributeValues (the low-level client). */
  | { readonly service: 'dynamodb'; readonly action: DynamoDbAction; readonly input: Record<string, any> }
  /** A DynamoDB call with plain JavaScript values (the document client). */
  | { readonly service: 'document'; readonly action: DocumentAction; readonly input: Record<string, any> }
  | { readonly service: 'sfn'; readonly action: StepFunctionsAction; readonly input: Record<string, any> }
  /** The time, epoch milliseconds. */
  | { readonly service: 'clock' }
  /** A random UUID. */
  | { readonly service: 'uuid' };

/** A flow: yields effects, gets their answers, returns T. A failed call is thrown into it. */
export type Flow<T> = Generator<Effect, T, any>;

/** Call DynamoDB (AttributeValues). */
export function* dynamodb(action: DynamoDbAction, input: Record<string, any>): Flow<any> {
  return yield { service: 'dynamodb', action, input };
}

/** Call DynamoDB with plain values (the document client's marshalling). */
export function* document(action: DocumentAction, input: Record<string, any>): Flow<any> {
  return yield { service: 'document', action, input };
}

/** Call Step Functions. */
export function* stepFunctions(action: StepFunctionsAction, input: Record<string, any>): Flow<any> {
  return yield { service: 'sfn', action, input };
}

/** The time, epoch milliseconds. */
export function* clock(): Flow<number> {
  return yield { service: 'clock' };
}

/** A random UUID. */
export function* uuid(): Flow<string> {
  return yield { service: 'uuid' };
}

/** The clients a flow's calls go to. */
export interface FlowClients {
  readonly dynamodb: ddb.DynamoDBClient;
  /** @default - a document client over `dynamodb` */
  readonly document?: doc.DynamoDBDocumentClient;
  readonly stepFunctions: sfn.SFNClient;
  /**
   * The client for SendTaskSuccess, with `maxAttempts: 1`: a retried wake-up that did wake the waiter
   * hears TaskTimedOut, and the caller would take back the permit the waiter is using.
   * @default - `stepFunctions`
   */
  readonly wakeUps?: sfn.SFNClient;
}

type AnyCommand = new (input: any) => any;
const DYNAMODB_COMMANDS: Record<DynamoDbAction, AnyCommand> = {
  GetItem: ddb.GetItemCommand,
  UpdateItem: ddb.UpdateItemCommand,
  DeleteItem: ddb.DeleteItemCommand,
  Scan: ddb.ScanCommand,
};
const DOCUMENT_COMMANDS: Record<DocumentAction, AnyCommand> = { Get: doc.GetCommand, Update: doc.UpdateCommand, Scan: doc.ScanCommand };
const SFN_COMMANDS: Record<StepFunctionsAction, AnyCommand> = {
  DescribeExecution: sfn.DescribeExecutionCommand,
  StopExecution: sfn.StopExecutionCommand,
  SendTaskSuccess: sfn.SendTaskSuccessCommand,
  GetExecutionHistory: sfn.GetExecutionHistoryCommand,
  ListExecutions: sfn.ListExecutionsCommand,
};

/** Run a flow against AWS. */
export async function runFlow<T>(flow: Flow<T>, clients: FlowClients): Promise<T> {
  const documentClient = clients.document ?? doc.DynamoDBDocumentClient.from(clients.dynamodb);
  let step = flow.next();
  while (!step.done) {
    const effect = step.value;
    let answer: unknown;
    try {
      answer = await perform(effect, clients, documentClient);
    } catch (e) {
      step = flow.throw(e);
      continue;
    }
    step = flow.next(answer);
  }
  return step.value;
}

async function perform(effect: Effect, clients: FlowClients, documentClient: doc.DynamoDBDocumentClient): Promise<unknown> {
  switch (effect.service) {
    case 'clock':
      return Date.now();
    case 'uuid':
      return globalThis.crypto.randomUUID();
    case 'dynamodb':
      return clients.dynamodb.send(new DYNAMODB_COMMANDS[effect.action](effect.input));
    case 'document':
      return documentClient.send(new DOCUMENT_COMMANDS[effect.action](effect.input));
    case 'sfn': {
      const client = effect.action === 'SendTaskSuccess' ? clients.wakeUps ?? clients.stepFunctions : clients.stepFunctions;
      return client.send(new SFN_COMMANDS[effect.action](effect.input));
    }
  }
}

/** The error name of a failed call, as the SDK names it (`ConditionalCheckFailedException`, `ExecutionDoesNotExist`). */
export function errorName(e: unknown): string {
  return (e as Error)?.name ?? '';
}
