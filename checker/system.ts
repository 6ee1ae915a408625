import { App, Stack, Stage } from 'aws-cdk-lib';
import * as lambda from 'aws-cdk-lib/aws-lambda';
import * as tasks from 'aws-cdk-lib/aws-stepfunctions-tasks';
import { AslMachine } from './asl';
import { ReconcilerConfig } from '../lambda/reconciler-flows';
import { CfnTemplate, physicalResources, resolve } from '../simulator/cfn';
import { ConcurrencyControlledWorkflow, ConcurrencyControlledWorkflowProps } from '../src';
import { STATE } from '../src/private/state-names';

/*
 * What the checker runs, taken from a synthesized stack: the workflow's and the cleanup's definitions
 * exactly as CDK renders them, the lock table, and the reconciler's settings from its environment.
 * Nothing about the protocol is written down twice.
 */

/** The name of the body's single Task in the checker's workflows. */
export const BODY_TASK = 'Do Work';
/** Where the body finds its permit (`{ fencingToken }`), so that the checker can see fencing tokens at body entry. */
export const PERMIT_PATH = '$.permit';

export interface System {
  readonly workflow: MachineInfo;
  readonly cleanup: MachineInfo;
  readonly tableName: string;
  /** The table's key attributes, partition key first. */
  readonly keySchema: string[];
  readonly lockName: string;
  readonly limit: number;
  /**
   * With a rate whose count is above the concurrency limit: the concurrency limit, which the bodies'
   * slots enforce (`limit` is then the rate's count, the lock's permits). @default - no body slot
   */
  readonly bodyLimit?: number;
  /**
   * A rate without a concurrency limit: the permit goes back once the interval has passed, from a
   * branch beside the body (which may still run), rather than after the body.
   */
  readonly releaseAtInterval: boolean;
  /** With a rate: its interval in seconds, as the acquire records it on the lock. @default - no rate */
  readonly rateIntervalSeconds?: number;
  /** How many permits each execution of the workflow takes (`permits`). */
  readonly permits: number;
  readonly reconciler: ReconcilerConfig;
  /** Whether the stack has the redrive guard's rule. */
  readonly redriveGuard: boolean;
}

export interface MachineInfo {
  readonly arn: string;
  readonly name: string;
  readonly machine: AslMachine;
}

/** Synthesize a workflow (its body one Lambda task) and read off everything the model needs. */
export function buildSystem(props: Partial<ConcurrencyControlledWorkflowProps>): System {
  const app = new App();
  const stack = new Stack(app, 'Check');
  const fn = new lambda.Function(stack, 'Work', {
    runtime: lambda.Runtime.NODEJS_18_X,
    handler: 'index.handler',
    code: lambda.Code.fromInline('exports.handler = async (event) => event;'),
  });
  const body = new tasks.LambdaInvoke(stack, BODY_TASK, { lambdaFunction: fn, payloadResponseOnly: true, retryOnServiceExceptions: false });
  const workflow = new ConcurrencyControlledWorkflow(stack, 'Workflow', {
    body,
    lockName: 'lock',
    stateMachineName: 'wf',
    permitPath: PERMIT_PATH,
    reconcilerScheduleEnabled: false,
    ...props,
  });
  const template = Stage.of(stack)!.synth().getStackArtifact(stack.artifactId).template as CfnTemplate;
  const resources = physicalResources(template, stack.stackName);
  const logicalId = (c: { node: { defaultChild?: unknown } }) => stack.getLogicalId(c.node.defaultChild as any);

  const machine = (sm: { node: { defaultChild?: unknown } }): MachineInfo => {
    const id = logicalId(sm);
    const properties = template.Resources[id].Properties!;
    let definition = resolve(properties.DefinitionString ?? properties.Definition, resources, stack.stackName);
    if (typeof definition === 'string') definition = JSON.parse(definition);
    if (properties.DefinitionSubstitutions) {
      let text = JSON.stringify(definition);
      const subs = resolve(properties.DefinitionSubstitutions, resources, stack.stackName) as Record<string, string>;
      for (const [k, v] of Object.entries(subs)) text = text.split('${' + k + '}').join(v);
      definition = JSON.parse(text);
    }
    const physical = resources.get(id)!;
    return { arn: physical.ref, name: physical.attributes.Name, machine: new AslMachine(definition) };
  };

  const tableId = logicalId(workflow.table.table);
  const tableProps = template.Resources[tableId].Properties!;
  const reconcilerId = logicalId(workflow.reconciler.reconcilerFunction);
  const variables = template.Resources[reconcilerId].Properties!.Environment?.Variables ?? {};
  const env = resolve(variables, resources, stack.stackName) as Record<string, string>;
  const number = (v: string | undefined) => (v === undefined ? undefined : Number(v));
  const wf = machine(workflow.stateMachine);
  if (!wf.machine.isInside(STATE.runBody, BODY_TASK)) throw new Error(`the body task '${BODY_TASK}' is not inside '${STATE.runBody}'`);
  return {
    workflow: wf,
    cleanup: machine(workflow.cleanupStateMachine),
    tableName: resources.get(tableId)!.ref,
    keySchema: (tableProps.KeySchema as Array<{ AttributeName: string; KeyType: string }>)
      .sort((a, b) => (a.KeyType === 'HASH' ? -1 : b.KeyType === 'HASH' ? 1 : 0))
      .map((k) => k.AttributeName),
    lockName: workflow.lockName,
    // The lock's permits as the construct decided them (the reconciler's), and its body slots as the definition takes them.
    limit: Number(env.CONCURRENCY_LIMIT),
    bodyLimit: number(/":bodyLimit":\{"N":"(\d+)"\}/.exec(JSON.stringify(wf.machine.definition))?.[1]),
    releaseAtInterval: wf.machine.isInside(STATE.runBody, STATE.prepareReleaseAtInterval),
    rateIntervalSeconds: number(/":rate":\{"N":"(\d+)"\}/.exec(JSON.stringify(wf.machine.definition))?.[1]),
    permits: props.permits ?? 1,
    reconciler: {
      tableName: env.TABLE_NAME,
      stateMachineArns: (env.STATE_MACHINE_ARNS ?? '').split(',').filter((a) => a !== ''),
      clockSkewMs: Number(env.CLOCK_SKEW_SECONDS ?? '30') * 1000,
      lockName: env.LOCK_NAME,
      lockNamePath: env.LOCK_NAME_PATH,
      concurrencyLimit: number(env.CONCURRENCY_LIMIT),
      concurrencyLimitPath: env.CONCURRENCY_LIMIT_PATH,
      permits: number(env.PERMITS),
      permitsPath: env.PERMITS_PATH,
      leaseSeconds: number(env.LEASE_SECONDS),
    },
    redriveGuard: workflow.reconciler.redriveRule !== undefined,
  };
}

