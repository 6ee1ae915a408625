import * as ddb from '@aws-sdk/client-dynamodb';
import { Stack } from 'aws-cdk-lib';
import { Template } from 'aws-cdk-lib/assertions';
import { ACCOUNT, CfnTemplate, PhysicalResource, physicalResources, REGION, resolve } from './cfn';
import { DynamoFaults, DynamoTaskRunner, LocalDynamoDb, TaskError } from './dynamodb';
import { EventPattern, matchesPattern, TargetInput, targetInput } from './eventbridge';
import { loadLocalStepFunctions, LocalStepFunctions } from './local-sfn';
import { chance, Random, seededRandom } from './random';

/*
 * Runs the state machines of a synthesized stack on this machine: definitions resolved from the
 * template, executed by aws-local-stepfunctions, DynamoDB tasks on dynalite, status-change events
 * matched against the stack's EventBridge rules and delivered to their targets. No AWS account.
 */

/** What a Lambda function or task override receives besides its input. */
export interface TaskContext {
  readonly simulator: Simulator;
  readonly execution: Execution;
  readonly stateName: string;
  /** Aborted when the execution stops (aborted, timed out, failed). */
  readonly signal: AbortSignal;
}

export type TaskHandler = (input: any, context: TaskContext) => Promise<unknown> | unknown;

/** Faults injected into the delivery of EventBridge events. */
export interface EventFaults {
  /** Probability that an event is never delivered. @default 0 */
  readonly lossRate?: number;
  /** Probability that an event is delivered twice. @default 0 */
  readonly duplicateRate?: number;
  /** Deliveries are delayed by up to this many simulated seconds. @default 0 */
  readonly maxDelaySeconds?: number;
}

export interface SimulatorOptions {
  /** Real time per simulated time: 0.01 runs one simulated second in 10 ms. @default 0.01 */
  readonly timeScale?: number;
  /** Seed of every random draw (jitter, faults). @default 1 */
  readonly seed?: number;
  readonly dynamoFaults?: DynamoFaults;
  readonly eventFaults?: EventFaults;
  /** Lambda functions by logical ID, for `lambda:invoke` and direct function ARN tasks. */
  readonly lambdaHandlers?: Record<string, TaskHandler>;
  /** Overrides of any Task state, by state name. */
  readonly taskHandlers?: Record<string, TaskHandler>;
}

export type ExecutionStatus = 'RUNNING' | 'SUCCEEDED' | 'FAILED' | 'TIMED_OUT' | 'ABORTED';

/** A simulated state machine. */
export interface SimStateMachine {
  readonly logicalId: string;
  readonly name: string;
  readonly arn: string;
  readonly definition: any;
}

/** One execution, running or finished. */
export class Execution {
  public status: ExecutionStatus = 'RUNNING';
  public output: unknown;
  public error?: string;
  public cause?: string;
  public stopDate?: number;
  /** Billed state transitions: states entered plus retries. */
  public transitions = 0;
  /** Transitions by state name. */
  public readonly stateTransitions = new Map<string, number>();
  /** DynamoDB calls made by this execution's tasks. */
  public dynamoCalls = 0;
  /** Resolves when the execution has stopped and its events are counted. */
  public readonly done: Promise<Execution>;
  /** Aborted when the execution stops, whatever the reason. */
  public readonly stopped = new AbortController();
  /** @internal */
  public abortRun?: () => void;
  private resolveDone!: (e: Execution) => void;

  constructor(
    public readonly arn: string,
    public readonly name: string,
    public readonly stateMachine: SimStateMachine,
    public readonly input: unknown,
    public readonly startDate: number,
  ) {
    this.done = new Promise((done) => (this.resolveDone = done));
  }

  /** Stop the execution, like `StopExecution`. */
  public abort(): void {
    if (this.status === 'RUNNING') {
      this.abortRun?.();
    }
  }

  /** @internal */
  public finish(): void {
    this.resolveDone(this);
  }
}

interface SimRule {
  readonly logicalId: string;
  readonly pattern: EventPattern;
  readonly targets: Array<TargetInput & { Arn: string }>;
}

export class Simulator {
  /** Start a simulator for every state machine, table and rule of `stack`. */
  public static async start(stack: Stack, options: SimulatorOptions = {}): Promise<Simulator> {
    const template = Template.fromStack(stack).toJSON() as CfnTemplate;
    const db = await LocalDynamoDb.start();
    const sim = new Simulator(template, stack.stackName, db, options);
    await db.createTables(
      template,
      new Map([...sim.resources].filter(([, r]) => r.type === 'AWS::DynamoDB::Table').map(([id, r]) => [id, r.ref])),
    );
    return sim;
  }

  public readonly random: Random;
  public readonly dynamo: DynamoTaskRunner;
  public readonly stateMachines = new Map<string, SimStateMachine>();
  public readonly executions = new Map<string, Execution>();
  /** Status-change events emitted, in order. */
  public readonly events: Array<Record<string, any>> = [];
  /** Events lost by injected faults. */
  public lostEvents = 0;
  public eventFaults: EventFaults;
  public readonly resources: Map<string, PhysicalResource>;

  private readonly sfn: LocalStepFunctions;
  private readonly timeScale: number;
  private readonly realStart = Date.now();
  private readonly rules: SimRule[] = [];
  private readonly pending = new Set<Promise<unknown>>();
  private executionCounter = 0;
  private readonly interpreters = new Map<string, InstanceType<LocalStepFunctions['StateMachine']>>();

  private constructor(
    template: CfnTemplate,
    stackName: string,
    public readonly db: LocalDynamoDb,
    private readonly options: SimulatorOptions,
  ) {
    this.timeScale = options.timeScale ?? 0.01;
    this.random = seededRandom(options.seed ?? 1);
    this.sfn = loadLocalStepFunctions(this.timeScale, this.random);
    this.dynamo = new DynamoTaskRunner(db, this.random, options.dynamoFaults);
    this.eventFaults = options.eventFaults ?? {};
    this.resources = physicalResources(template, stackName);

    for (const [logicalId, resource] of Object.entries(template.Resources)) {
      const props = resource.Properties ?? {};
      if (resource.Type === 'AWS::StepFunctions::StateMachine') {
        const physical = this.resources.get(logicalId)!;
        const body = resolve(props.DefinitionString ?? props.Definition, this.resources, stackName);
        let definition = typeof body === 'string' ? JSON.parse(body) : body;
        if (props.DefinitionSubstitutions) {
          const subs = resolve(props.DefinitionSubstitutions, this.resources, stackName) as Record<string, string>;
          let text = JSON.stringify(definition);
          for (const [k, v] of Object.entries(subs)) text = text.split('${' + k + '}').join(v);
          definition = JSON.parse(text);
        }
        this.stateMachines.set(logicalId, { logicalId, name: physical.attributes.Name, arn: physical.ref, definition });
      } else if (resource.Type === 'AWS::Events::Rule' && props.EventPattern && props.State !== 'DISABLED') {
        this.rules.push({
          logicalId,
          pattern: resolve(props.EventPattern, this.resources, stackName),
          targets: resolve(props.Targets ?? [], this.resources, stackName),
        });
      }
    }
  }

  /** Simulated time, epoch milliseconds. */
  public now(): number {
    return this.realStart + (Date.now() - this.realStart) / this.timeScale;
  }

  /** Sleep for simulated seconds. */
  public sleep(seconds: number, signal?: AbortSignal): Promise<void> {
    return new Promise((resolveSleep) => {
      const timer = setTimeout(resolveSleep, seconds * 1000 * this.timeScale);
      signal?.addEventListener('abort', () => {
        clearTimeout(timer);
        resolveSleep();
      });
    });
  }

  /** The state machine with this logical ID, or whose logical ID starts with it. */
  public stateMachine(logicalIdPrefix: string): SimStateMachine {
    const exact = this.stateMachines.get(logicalIdPrefix);
    const matches = exact ? [exact] : [...this.stateMachines.values()].filter((sm) => sm.logicalId.startsWith(logicalIdPrefix));
    if (matches.length !== 1) {
      throw new Error(`expected one state machine ${logicalIdPrefix}, found ${matches.map((m) => m.logicalId).join(', ') || 'none'}`);
    }
    return matches[0];
  }

  /** Start an execution, like `StartExecution`. */
  public startExecution(stateMachine: SimStateMachine, input: unknown = {}, name?: string): Execution {
    const execName = name ?? `exec-${++this.executionCounter}`;
    const arn = `arn:aws:states:${REGION}:${ACCOUNT}:execution:${stateMachine.name}:${execName}`;
    if (this.executions.has(arn)) {
      throw new TaskError('ExecutionAlreadyExists', `Execution Already Exists: '${arn}'`);
    }
    const execution = new Execution(arn, execName, stateMachine, input, this.now());
    this.executions.set(arn, execution);
    this.track(this.run(execution));
    return execution;
  }

  /** Wait until no execution runs and no event is on its way. */
  public async idle(): Promise<void> {
    while (this.pending.size > 0) {
      await Promise.allSettled([...this.pending]);
    }
  }

  /** Every item of a table (by logical ID prefix or physical name). */
  public async scan(table: string): Promise<Array<Record<string, ddb.AttributeValue>>> {
    const resource = [...this.resources.values()].find(
      (r) => r.type === 'AWS::DynamoDB::Table' && (r.logicalId.startsWith(table) || r.ref === table),
    );
    const items: Array<Record<string, ddb.AttributeValue>> = [];
    let ExclusiveStartKey: Record<string, ddb.AttributeValue> | undefined;
    do {
      const page = await this.db.client.send(new ddb.ScanCommand({ TableName: resource?.ref ?? table, ExclusiveStartKey, ConsistentRead: true }));
      items.push(...(page.Items ?? []));
      ExclusiveStartKey = page.LastEvaluatedKey;
    } while (ExclusiveStartKey);
    return items;
  }

  /** Deliver an event to every rule it matches, as EventBridge would (subject to `eventFaults`). */
  public putEvent(event: Record<string, any>): void {
    for (const rule of this.rules) {
      if (!matchesPattern(rule.pattern, event)) continue;
      for (const target of rule.targets) {
        if (chance(this.random, this.eventFaults.lossRate ?? 0)) {
          this.lostEvents++;
          continue;
        }
        const copies = chance(this.random, this.eventFaults.duplicateRate ?? 0) ? 2 : 1;
        for (let i = 0; i < copies; i++) {
          const delay = this.random() * (this.eventFaults.maxDelaySeconds ?? 0);
          this.track(this.deliver(target, event, delay));
        }
      }
    }
  }

  public async stop(): Promise<void> {
    for (const execution of this.executions.values()) execution.abort();
    await this.idle();
    await this.db.stop();
  }

  private track(promise: Promise<unknown>): void {
    this.pending.add(promise);
    void promise.finally(() => this.pending.delete(promise));
  }

  private async deliver(target: TargetInput & { Arn: string }, event: Record<string, any>, delaySeconds: number): Promise<void> {
    if (delaySeconds > 0) await this.sleep(delaySeconds);
    const stateMachine = [...this.stateMachines.values()].find((sm) => sm.arn === target.Arn);
    if (!stateMachine) {
      throw new Error(`rule target ${target.Arn} is not a state machine of this stack`);
    }
    await this.startExecution(stateMachine, targetInput(target, event)).done;
  }

  private async run(execution: Execution): Promise<void> {
    const machine = this.interpreter(execution.stateMachine);
    const sim = this;
    const run = machine.run(execution.input as any, {
      overrides: { taskResourceLocalHandlers: this.taskOverrides(execution) },
      context: {
        Execution: {
          Id: execution.arn,
          Name: execution.name,
          RoleArn: `arn:aws:iam::${ACCOUNT}:role/${execution.stateMachine.logicalId}Role`,
          StartTime: new Date(execution.startDate).toISOString(),
        },
        StateMachine: { Id: execution.stateMachine.arn, Name: execution.stateMachine.name },
        State: {
          get EnteredTime() {
            return new Date(sim.now()).toISOString();
          },
        },
      },
    });
    execution.abortRun = run.abort;
    this.emitStatusChange(execution);

    const counting = (async () => {
      for await (const event of run.eventLogs) {
        if (event.type === 'StateEntered' || event.type === 'StateRetried') {
          execution.transitions++;
          const name = event.state.name;
          execution.stateTransitions.set(name, (execution.stateTransitions.get(name) ?? 0) + 1);
        }
      }
    })();

    try {
      execution.output = await run.result;
      execution.status = 'SUCCEEDED';
    } catch (e) {
      const err = e as Error & { cause?: Error };
      if (err.name === 'ExecutionAbortedError') {
        execution.status = 'ABORTED';
      } else if (err.name === 'ExecutionTimeoutError') {
        execution.status = 'TIMED_OUT';
        execution.error = 'States.Timeout';
      } else if (err.name === 'ExecutionError' && err.cause) {
        execution.status = 'FAILED';
        execution.error = err.cause.name;
        execution.cause = err.cause.message;
      } else {
        execution.status = 'FAILED';
        execution.error = err.name;
        execution.cause = err.message;
      }
    }
    execution.stopDate = this.now();
    execution.stopped.abort();
    await counting;
    this.emitStatusChange(execution);
    execution.finish();
  }

  /**
   * One interpreter per state machine, built (and its definition validated) once: validation compiles
   * a JSON schema, far too slow to repeat for every execution.
   */
  private interpreter(stateMachine: SimStateMachine): InstanceType<LocalStepFunctions['StateMachine']> {
    let machine = this.interpreters.get(stateMachine.arn);
    if (!machine) {
      machine = new this.sfn.StateMachine(stateMachine.definition, { validationOptions: { checkArn: false } });
      this.interpreters.set(stateMachine.arn, machine);
    }
    return machine;
  }

  /** A handler for every Task state of the definition, nested branches included. */
  private taskOverrides(execution: Execution): Record<string, (input: any) => Promise<any>> {
    const overrides: Record<string, (input: any) => Promise<any>> = {};
    for (const [stateName, state] of allStates(execution.stateMachine.definition)) {
      if (state.Type !== 'Task') continue;
      overrides[stateName] = async (input: any) => {
        // An aborted execution runs no more tasks. (The interpreter would otherwise run a pending
        // retry of a task after the abort; Step Functions does not.)
        if (execution.stopped.signal.aborted) return new Promise(() => undefined);
        return this.runTask(execution, stateName, state.Resource, input);
      };
    }
    return overrides;
  }

  private async runTask(execution: Execution, stateName: string, resource: string, input: any): Promise<unknown> {
    const context: TaskContext = { simulator: this, execution, stateName, signal: execution.stopped.signal };
    const override = this.options.taskHandlers?.[stateName];
    if (override) {
      return override(input, context);
    }
    if (DynamoTaskRunner.handles(resource)) {
      execution.dynamoCalls++;
      return this.dynamo.run(resource, input);
    }
    if (resource === 'arn:aws:states:::aws-sdk:sfn:describeExecution') {
      return this.describeExecution(input.ExecutionArn);
    }
    if (resource === 'arn:aws:states:::lambda:invoke') {
      const payload = await this.invokeLambda(String(input.FunctionName), input.Payload, context);
      return { ExecutedVersion: '$LATEST', Payload: payload, StatusCode: 200 };
    }
    if (resource.startsWith('arn:aws:lambda:')) {
      return this.invokeLambda(resource, input, context);
    }
    throw new Error(`the simulator has no handler for task '${stateName}' (${resource})`);
  }

  private async invokeLambda(functionArnOrName: string, payload: unknown, context: TaskContext): Promise<unknown> {
    const fn = [...this.resources.values()].find(
      (r) => r.type === 'AWS::Lambda::Function' && (r.attributes.Arn === functionArnOrName || r.ref === functionArnOrName),
    );
    const handler = fn && this.options.lambdaHandlers?.[fn.logicalId];
    if (!handler) {
      throw new Error(`no Lambda handler registered for ${functionArnOrName}`);
    }
    try {
      return await handler(payload, context);
    } catch (e) {
      const err = e as Error;
      // As Step Functions reports an unhandled function error: the function's error type, and its
      // error object as the cause.
      throw new TaskError(err.name || 'Error', JSON.stringify({ errorType: err.name, errorMessage: err.message, trace: [] }));
    }
  }

  private describeExecution(executionArn: string): unknown {
    const e = this.executions.get(executionArn);
    if (!e) {
      throw new TaskError('Sfn.ExecutionDoesNotExistException', `Execution Does Not Exist: '${executionArn}'`);
    }
    return {
      ExecutionArn: e.arn,
      StateMachineArn: e.stateMachine.arn,
      Name: e.name,
      Status: e.status,
      StartDate: new Date(e.startDate).toISOString(),
      ...(e.stopDate !== undefined ? { StopDate: new Date(e.stopDate).toISOString() } : {}),
      Input: JSON.stringify(e.input),
      InputDetails: { Included: true },
    };
  }

  /** "Step Functions Execution Status Change", as documented in the Step Functions developer guide. */
  private emitStatusChange(e: Execution): void {
    const input = JSON.stringify(e.input);
    // EventBridge events are at most 256 KiB; Step Functions leaves out payloads above 248 KiB.
    const inputIncluded = input.length <= 248 * 1024;
    const output = e.status === 'SUCCEEDED' ? JSON.stringify(e.output) : null;
    const event = {
      'version': '0',
      'id': `event-${this.events.length + 1}`,
      'detail-type': 'Step Functions Execution Status Change',
      'source': 'aws.states',
      'account': ACCOUNT,
      'time': new Date(this.now()).toISOString(),
      'region': REGION,
      'resources': [e.arn],
      'detail': {
        executionArn: e.arn,
        stateMachineArn: e.stateMachine.arn,
        name: e.name,
        status: e.status,
        startDate: e.startDate,
        stopDate: e.stopDate ?? null,
        input: inputIncluded ? input : null,
        output,
        inputDetails: { included: inputIncluded },
        outputDetails: output === null ? null : { included: true },
        error: e.error ?? null,
        cause: e.cause ?? null,
      },
    };
    this.events.push(event);
    this.putEvent(event);
  }
}

/** Every state of a definition, nested Parallel branches and Map iterators included. */
export function allStates(definition: any): Array<[string, any]> {
  const result: Array<[string, any]> = [];
  for (const [name, state] of Object.entries<any>(definition.States ?? {})) {
    result.push([name, state]);
    for (const branch of state.Branches ?? []) result.push(...allStates(branch));
    if (state.Iterator) result.push(...allStates(state.Iterator));
    if (state.ItemProcessor) result.push(...allStates(state.ItemProcessor));
  }
  return result;
}
