/**
 * `cdk-sfn-semaphore/testing`: run the state machines of your CDK stack on this machine, with the
 * library's simulator: no AWS account, no Docker, no Java. It works in Jest and in plain Node.
 *
 * - `runWorkflowScenario(workflow, options)` starts many executions of a `ConcurrencyControlledWorkflow`
 *   at once, with injected faults (failing bodies, stops inside the body, lost, duplicated or delayed
 *   status events, lost wake-ups, throttling and DynamoDB's capacity rules), and returns what the
 *   library's bench reports (transitions, DynamoDB calls, write and read units, dollars per 1,000
 *   executions) and the invariants it checked (`brokenInvariants`).
 * - `WorkflowSimulator.start(workflow, options)` gives you the running simulator for tests of your own:
 *   start, wait for and stop executions, read the lock (holders, waiters, permits in use), sweep, and
 *   share the lock with a `SemaphoreClient` or the CLI (`tableName`).
 *
 * Task states are replaced by handlers by state name (`taskHandlers`), Lambda functions by logical ID
 * (`lambdaHandlers`, which run under the function's `Timeout` as its code would); functions without a
 * handler run their synthesized code. What the simulator cannot
 * run as AWS would (JSONata, DynamoDB transactions, a Distributed Map, ...) is refused when it starts,
 * naming the state. The behaviours it models, and its known gaps, are listed in
 * docs/simulator-fidelity.md of the repository.
 */
import { CfnElement, Stack, Stage } from 'aws-cdk-lib';
import { runScenario, ScenarioOptions, ScenarioResult, Subject } from '../simulator/scenario';
import { ACQUIRE_STATES, BODY_ENTER, BODY_LEAVE, LOCK_LAYOUT, LockState, lockStatesIn, waitingTickets } from '../simulator/semaphore';
import { Execution, Simulator, SimulatorOptions, StartOptions, TaskHandler } from '../simulator/simulator';
import type { ConcurrencyControlledWorkflow } from '../src';
import { TICKET_WAITER } from '../src/private/lock-schema';
import { STATE } from '../src/private/state-names';

export { Execution, Simulator } from '../simulator/simulator';
export type { EventFaults, SimulatorOptions, StaleReads, StartOptions, TaskContext, TaskHandler } from '../simulator/simulator';
export type { CapacityOptions, DynamoFaults } from '../simulator/dynamodb';
export type { LockState } from '../simulator/semaphore';
export type { Progress, ScenarioResult } from '../simulator/scenario';
export { brokenInvariants, PRICES } from '../simulator/scenario';
export { ApiError } from '../simulator/sfn-api';
export { logEventsOf, matchesFilterPattern, metricFilterSums } from '../simulator/logs';
export type { ExecutionLogEvent } from '../simulator/logs';

/** The error a body fails with when `runWorkflowScenario` makes it fail (`failureRate`). */
export const INJECTED_BODY_FAILURE = 'WorkFailed';

/** Options of `runWorkflowScenario`. */
export interface WorkflowScenarioOptions extends Omit<ScenarioOptions, 'onProgress' | 'atHorizon'> {
  /**
   * Handlers of Task states, by state name: your body's tasks, and any other task of the stack. The
   * first body task an execution enters takes its `workSeconds` (simulated) and fails with
   * `INJECTED_BODY_FAILURE` for the executions `failureRate` picks; then your handler runs.
   */
  readonly taskHandlers?: Record<string, TaskHandler>;
}

/** What the scenario runner needs to know of a workflow: its stack, state machine, table and body. */
export function workflowSubject(workflow: ConcurrencyControlledWorkflow): Subject {
  const stack = Stack.of(workflow);
  const tableResource = workflow.table.table.node.defaultChild;
  if (!(tableResource instanceof CfnElement) || Stack.of(tableResource) !== stack) {
    throw new Error(
      `${workflow.node.path} uses a table its stack does not define (${workflow.table.node.path}): the simulator runs the resources of one stack, define the SemaphoreTable in it for the test`,
    );
  }
  const stateMachineId = stack.getLogicalId(workflow.stateMachine.node.defaultChild as CfnElement);
  return {
    name: workflow.node.path,
    stack,
    stateMachine: stateMachineId,
    table: stack.getLogicalId(tableResource),
    layout: LOCK_LAYOUT,
    enterStates: BODY_ENTER,
    leaveStates: BODY_LEAVE,
    acquireStates: ACQUIRE_STATES,
    bodyStates: bodyStateNames(synthesizedDefinition(stack, stateMachineId)),
    bodyFunctions: [],
  };
}

/**
 * Start `executions` executions of the workflow at once, with the faults of `options`, run them to
 * the end (or the horizon), sweep once as the reconciler's schedule would, and report. For a lock split
 * by `lockStripes`, `limit` is the whole limit, and each stripe is held to `limit / lockStripes` unless
 * `lockLimit` says otherwise. Pass the result
 * to `brokenInvariants(result, limit)` for the invariants: never more than the limit inside, no permit
 * left held, nobody stuck, every failure explained.
 */
export async function runWorkflowScenario(workflow: ConcurrencyControlledWorkflow, options: WorkflowScenarioOptions): Promise<ScenarioResult> {
  const subject = workflowSubject(workflow);
  const bodyTasks = new Set(subject.bodyStates);
  const worked = new Set<string>();
  const handlers: Record<string, TaskHandler> = {};
  for (const [state, handler] of Object.entries(options.taskHandlers ?? {})) {
    handlers[state] = !bodyTasks.has(state)
      ? handler
      : async (input, context) => {
        const plan = context.execution.input as { workSeconds?: number; fail?: boolean };
        if (!worked.has(context.execution.arn)) {
          worked.add(context.execution.arn);
          await context.simulator.sleep(plan.workSeconds ?? 0, context.signal);
          if (plan.fail) throw Object.assign(new Error('the scenario made this body fail'), { name: INJECTED_BODY_FAILURE });
        }
        return handler(input, context);
      };
  }
  if ((options.failureRate ?? 0) > 0 && !Object.keys(handlers).some((state) => bodyTasks.has(state))) {
    throw new Error(`failureRate needs a handler of one of the body's Task states (taskHandlers), one of: ${subject.bodyStates.join(', ') || '(none)'}`);
  }
  // A lock split by `lockStripes`: each stripe's lock item is held to its share of the limit.
  const lockLimit = options.lockLimit ?? (workflow.lockStripes > 1 ? options.limit / workflow.lockStripes : undefined);
  return runScenario(subject, { ...options, lockLimit, taskHandlers: handlers });
}

/**
 * A lock as the workflow sees it: its holders, the executions waiting in its queue, its permits in use.
 * Executions are named by their ARNs (the lock item keys them by a shorter holder id, `Execution.holderId`),
 * leases by their ids.
 */
export interface LockView extends LockState {
  /** Execution ARNs waiting in the lock's queue, first come first. */
  readonly waiters: string[];
}

/** The simulator running a workflow's stack, with the lock and the figures at hand. */
export class WorkflowSimulator {
  /** Start the simulator on the stack of `workflow` (only one runs at a time in a process). */
  public static async start(workflow: ConcurrencyControlledWorkflow, options: SimulatorOptions = {}): Promise<WorkflowSimulator> {
    return new WorkflowSimulator(workflow, await Simulator.start(Stack.of(workflow), options));
  }

  private readonly subject: Subject;
  private readonly cleanupStateMachine: string;

  private constructor(
    workflow: ConcurrencyControlledWorkflow,
    /** The simulator itself: every execution, the event log, fault counters, `sleep` on its clock. */
    public readonly simulator: Simulator,
  ) {
    this.subject = workflowSubject(workflow);
    this.cleanupStateMachine = Stack.of(workflow).getLogicalId(workflow.cleanupStateMachine.node.defaultChild as CfnElement);
  }

  /**
   * The name of the workflow's lock table in the simulation. While the simulator runs, the SDK's
   * environment variables of this process point to it (`AWS_ENDPOINT_URL_DYNAMODB`, `AWS_ENDPOINT_URL_SFN`,
   * with `AWS_REGION` and local credentials), so a `SemaphoreClient` made then and given this name, or the
   * CLI given it as `--table` (or `CDK_SFN_SEMAPHORE_TABLE`) in a child process that inherits that
   * environment, shares the permits with the simulated executions, and its hand-offs wake them. A lease's
   * time is real time: start the simulator with `schedules: false` beside one, or the reconciler's sweeps,
   * which read the simulation's faster clock, reclaim the lease as expired within seconds.
   */
  public get tableName(): string {
    return this.simulator.tableName(this.subject.table);
  }

  /** Start an execution of the workflow; `await execution.done` for its end, `execution.abort()` to stop it. */
  public start(input: unknown = {}, options: StartOptions = {}): Execution {
    return this.simulator.startExecution(this.simulator.stateMachine(this.subject.stateMachine), input, options);
  }

  /** Every lock of the workflow's table (or the one named): holders, waiters and permits in use. */
  public async locks(lockName?: string): Promise<LockView[]> {
    const simulator = this.simulator;
    const items = await this.simulator.scan(this.subject.table);
    return lockStatesIn(items)
      .filter((lock) => lockName === undefined || lock.lockName === lockName)
      .map((lock) => ({
        ...lock,
        holders: lock.holders.map(arnOf),
        waiters: waitingTickets(items, lock.lockName).map((ticket) => arnOf(ticket[TICKET_WAITER].S!)),
      }));
    function arnOf(this: void, holderId: string): string {
      return simulator.executionOfHolder(holderId)?.arn ?? holderId;
    }
  }

  /** Run every scheduled rule once, as its schedule would (the reconciler's sweep), and wait for the work it started. */
  public async sweep(): Promise<void> {
    await this.simulator.fireScheduledRules();
    await this.simulator.idle();
  }

  /**
   * The figures of these executions, per execution: billed transitions and DynamoDB calls, and the write
   * and read units, as DynamoDB bills them, of their calls and of the workflow's cleanup executions.
   */
  public figures(executions: Execution[]): { transitions: number; dynamoCalls: number; writeUnits: number; readUnits: number } {
    const cleanup = this.simulator.stateMachine(this.cleanupStateMachine);
    const cleanups = [...this.simulator.executions.values()].filter((e) => e.stateMachine === cleanup);
    const per = (f: (e: Execution) => number, all: Execution[]) => all.reduce((n, e) => n + f(e), 0) / Math.max(1, executions.length);
    return {
      transitions: per((e) => e.transitions, executions),
      dynamoCalls: per((e) => e.dynamoCalls, executions),
      writeUnits: per((e) => e.writeUnits, [...executions, ...cleanups]),
      readUnits: per((e) => e.readUnits, [...executions, ...cleanups]),
    };
  }

  /** Stop the simulator: its DynamoDB, servers and timers. */
  public async stop(): Promise<void> {
    await this.simulator.stop();
  }
}

/** A state machine's definition as the stack synthesizes it, with CloudFormation references left as text. */
function synthesizedDefinition(stack: Stack, logicalId: string): any {
  const template = Stage.of(stack)!.synth().getStackArtifact(stack.artifactId).template;
  const body = template.Resources[logicalId].Properties.DefinitionString;
  const text = typeof body === 'string' ? body : body['Fn::Join'][1].map((part: unknown) => (typeof part === 'string' ? part : 'REF')).join('');
  return JSON.parse(text);
}

/** The names of the states of the workflow's body: the branch of its "Run Body" Parallel state. */
function bodyStateNames(definition: any): string[] {
  const names: string[] = [];
  const visit = (states: Record<string, any>, inBody: boolean) => {
    for (const [name, state] of Object.entries(states)) {
      if (inBody) names.push(name);
      for (const branch of state.Branches ?? []) visit(branch.States, inBody || name === STATE.runBody);
      const iterator = state.ItemProcessor ?? state.Iterator;
      if (iterator) visit(iterator.States, inBody);
    }
  };
  visit(definition.States, false);
  return names;
}
