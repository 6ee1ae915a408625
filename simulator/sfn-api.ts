import * as http from 'http';
import { AddressInfo } from 'net';
import { keepIdleConnections } from './dynamodb';

/*
 * The part of the Step Functions API that code under test (Lambda handlers, the CLI) calls, served
 * over the real wire protocol (JSON 1.0, `X-Amz-Target: AWSStepFunctions.<Operation>`), so that the
 * AWS SDK pointed at it with `AWS_ENDPOINT_URL_SFN` behaves as against AWS.
 */

/** What the API needs from the simulator. */
export interface StepFunctionsBackend {
  describeExecution(executionArn: string): Record<string, unknown>;
  stopExecution(executionArn: string, error?: string, cause?: string): Record<string, unknown>;
  startExecution(stateMachineArn: string, input?: string, name?: string): Record<string, unknown>;
  listExecutions(stateMachineArn: string, statusFilter?: string, redriveFilter?: string): Array<Record<string, unknown>>;
  sendTaskSuccess(taskToken: string, output: string): void;
  sendTaskFailure(taskToken: string, error?: string, cause?: string): void;
  sendTaskHeartbeat(taskToken: string): void;
  getExecutionHistory(executionArn: string, reverseOrder: boolean): Array<Record<string, unknown>>;
}

/** An API error, named as Step Functions names it (`ExecutionDoesNotExist`, `TaskTimedOut`, ...). */
export class ApiError extends Error {
  constructor(
    public readonly code: string,
    message: string,
  ) {
    super(message);
    this.name = code;
  }
}

export class StepFunctionsApi {
  public static async start(backend: StepFunctionsBackend): Promise<StepFunctionsApi> {
    const api = new StepFunctionsApi(backend);
    keepIdleConnections(api.server);
    await new Promise<void>((resolve) => api.server.listen(0, '127.0.0.1', () => resolve()));
    return api;
  }

  /** Calls received, by operation. */
  public readonly calls = new Map<string, number>();
  private readonly server: http.Server;

  private constructor(private readonly backend: StepFunctionsBackend) {
    this.server = http.createServer((req, res) => {
      const chunks: Buffer[] = [];
      req.on('data', (c: Buffer) => chunks.push(c));
      req.on('end', () => {
        const operation = String(req.headers['x-amz-target'] ?? '').replace('AWSStepFunctions.', '');
        this.calls.set(operation, (this.calls.get(operation) ?? 0) + 1);
        let status = 200;
        let payload: unknown;
        try {
          payload = this.handle(operation, JSON.parse(Buffer.concat(chunks).toString() || '{}'));
        } catch (e) {
          const err = e as Error;
          status = 400;
          payload = { __type: err instanceof ApiError ? err.code : 'InvalidParameter', message: err.message };
        }
        res.writeHead(status, { 'Content-Type': 'application/x-amz-json-1.0' });
        res.end(JSON.stringify(payload));
      });
    });
  }

  /** Endpoint URL for `AWS_ENDPOINT_URL_SFN`. */
  public get endpoint(): string {
    return `http://127.0.0.1:${(this.server.address() as AddressInfo).port}`;
  }

  public stop(): Promise<void> {
    this.server.closeAllConnections();
    return new Promise((resolve) => this.server.close(() => resolve()));
  }

  private handle(operation: string, input: any): unknown {
    switch (operation) {
      case 'DescribeExecution':
        return this.backend.describeExecution(input.executionArn);
      case 'StopExecution':
        return this.backend.stopExecution(input.executionArn, input.error, input.cause);
      case 'StartExecution':
        return this.backend.startExecution(input.stateMachineArn, input.input, input.name);
      case 'ListExecutions': {
        // Pages of at most maxResults (default 100), continued with an index token.
        const all = this.backend.listExecutions(input.stateMachineArn, input.statusFilter, input.redriveFilter);
        const start = Number(input.nextToken ?? 0);
        const size = input.maxResults || 100;
        const page = all.slice(start, start + size);
        return { executions: page, ...(start + size < all.length ? { nextToken: String(start + size) } : {}) };
      }
      case 'GetExecutionHistory': {
        const history = this.backend.getExecutionHistory(input.executionArn, input.reverseOrder === true);
        // "You can select whether execution data (input or output of a history event) is returned. The
        // default is true." (API_GetExecutionHistory.html)
        const all = input.includeExecutionData === false ? history.map(withoutExecutionData) : history;
        const start = Number(input.nextToken ?? 0);
        const size = input.maxResults || 1000;
        return { events: all.slice(start, start + size), ...(start + size < all.length ? { nextToken: String(start + size) } : {}) };
      }
      case 'SendTaskSuccess':
        this.backend.sendTaskSuccess(input.taskToken, input.output);
        return {};
      case 'SendTaskFailure':
        this.backend.sendTaskFailure(input.taskToken, input.error, input.cause);
        return {};
      case 'SendTaskHeartbeat':
        this.backend.sendTaskHeartbeat(input.taskToken);
        return {};
      default:
        throw new ApiError('UnknownOperationException', `the simulator does not serve ${operation}`);
    }
  }
}

/** A history event without its execution data: the inputs, outputs and parameters of its details. */
function withoutExecutionData(event: Record<string, unknown>): Record<string, unknown> {
  const data = ['input', 'inputDetails', 'output', 'outputDetails', 'parameters'];
  return Object.fromEntries(
    Object.entries(event).map(([k, v]) =>
      k.endsWith('EventDetails') && typeof v === 'object' && v !== null ? [k, Object.fromEntries(Object.entries(v).filter(([f]) => !data.includes(f)))] : [k, v],
    ),
  );
}
