import { App, CfnParameter, Duration, Stack } from 'aws-cdk-lib';
import { Template } from 'aws-cdk-lib/assertions';
import * as kms from 'aws-cdk-lib/aws-kms';
import * as lambda from 'aws-cdk-lib/aws-lambda';
import * as sfn from 'aws-cdk-lib/aws-stepfunctions';
import { ConcurrencyControlledWorkflow, IdempotencyKey, IdempotencyTable, IdempotentWorkflow, IdempotentWorkflowProps } from '../src';
import { canonicalJson, computeKey, NO_VALIDATION, parseFieldPath, select } from '../src/private/idempotency-key';

/*
 * Synth-time behaviour of idempotency (checks of the options, permissions, the table) and the key
 * computation itself. What the states do is executed in idempotency-simulation.test.ts.
 */

function newStack() {
  return new Stack(new App(), 'Stack');
}

function idempotent(props: Partial<IdempotentWorkflowProps> = {}, stack = newStack()) {
  const workflow = new IdempotentWorkflow(stack, 'Workflow', { body: new sfn.Pass(stack, 'Work'), ...props });
  return { stack, workflow };
}

/** Statements of the policies attached to a role, by the role's logical ID prefix. */
function policyStatements(stack: Stack, rolePrefix: string): any[] {
  const policies = Template.fromStack(stack).findResources('AWS::IAM::Policy');
  return Object.values(policies)
    .filter((p: any) => p.Properties.Roles.some((r: any) => r.Ref.startsWith(rolePrefix)))
    .flatMap((p: any) => p.Properties.PolicyDocument.Statement);
}

function actionsOn(statements: any[]): Record<string, string[]> {
  const byResource: Record<string, string[]> = {};
  for (const st of statements) {
    for (const resource of [st.Resource].flat()) {
      const key = JSON.stringify(resource);
      byResource[key] = [...(byResource[key] ?? []), ...[st.Action].flat()].sort();
    }
  }
  return byResource;
}

describe('options are checked at synth time', () => {
  test.each<[string, () => unknown, RegExp | string]>([
    ['no fields', () => IdempotencyKey.fromFields(), '`key` must list at least one JSONPath, got an empty list'],
    ['a field path that is not one', () => IdempotencyKey.fromFields('$.a', 'order.id'), /`key` must be JSONPaths .* got: 'order.id'/],
    ['a filter expression', () => IdempotencyKey.fromFields('$.items[?(@.sku)]'), /got: '\$.items\[\?\(@.sku\)\]'/],
    ['a JMESPath that does not parse', () => IdempotencyKey.fromJmesPath('[orderId,'), /`key` must be a valid JMESPath expression, got: '\[orderId,' \(/],
    ['an empty JMESPath', () => IdempotencyKey.fromJmesPath(' '), "`key` must be a valid JMESPath expression, got: ' ' (it is empty)"],
    ['expiresAfter in milliseconds', () => idempotent({ expiresAfter: Duration.millis(1500) }), /`expiresAfter` must be a whole number of seconds, at least 1 second, got: 1 second 500 millis/],
    ['a zero poll interval', () => idempotent({ duplicatePollInterval: Duration.seconds(0) }), /`duplicatePollInterval` must be a whole number of seconds, at least 1 second/],
    ['validated fields that are not paths', () => idempotent({ validateFields: ['amount'] }), /`validateFields` must be JSONPaths .* got: 'amount'/],
    ['an empty validation list', () => idempotent({ validateFields: [] }), '`validateFields` must list at least one JSONPath, got an empty list'],
    [
      'a duplicate wait longer than the history holds',
      () => idempotent({ duplicateWaitTimeout: Duration.hours(3) }),
      '`duplicateWaitTimeout` (3 hours) at `duplicatePollInterval` 10 seconds means about 1440 checks; at most 782 fit in the 18000 history events this wait may spend (an execution fails at 25,000 events): make the interval longer or the timeout shorter',
    ],
    [
      'a duration token',
      () => {
        const stack = newStack();
        return idempotent({ expiresAfter: Duration.millis(new CfnParameter(stack, 'Ttl', { type: 'Number' }).valueAsNumber) }, stack);
      },
      /`expiresAfter` must be a fixed duration, known at synth time, got a token/,
    ],
    [
      'the option on a workflow too',
      () => new ConcurrencyControlledWorkflow(newStack(), 'W', { body: new sfn.Pass(newStack(), 'P'), idempotency: { expiresAfter: Duration.millis(10) } }),
      /`expiresAfter` must be a whole number of seconds/,
    ],
  ])('%s', (_name, make, message) => {
    expect(make).toThrow(message);
  });
});

describe('resources and permissions', () => {
  test('the state machine may invoke the key function, read and write its records, and describe its own executions: nothing else', () => {
    const { stack, workflow } = idempotent();
    const template = Template.fromStack(stack);
    const name = template.findResources('AWS::StepFunctions::StateMachine');
    const [sm] = Object.values(name) as any[];
    expect(sm.Properties.StateMachineName).toMatch(/^Stack-Workflow-[0-9A-F]{8}$/);

    const statements = policyStatements(stack, 'WorkflowStateMachineRole').filter(
      (st) => ![st.Action].flat().some((a: string) => a.startsWith('xray:') || a.startsWith('logs:')),
    );
    const byResource = Object.entries(actionsOn(statements)).map(([resource, actions]) => [resource, [...new Set(actions)]]);
    const table = stack.getLogicalId(workflow.table.table.node.defaultChild as any);
    const keyFunction = stack.getLogicalId(workflow.keyFunction.node.defaultChild as any);
    expect(byResource).toEqual([
      [JSON.stringify({ 'Fn::GetAtt': [keyFunction, 'Arn'] }), ['lambda:InvokeFunction']],
      [expect.stringMatching(new RegExp(`^\\{"Fn::Join":.*"${keyFunction}","Arn".*":\\*"`)), ['lambda:InvokeFunction']],
      [expect.stringMatching(new RegExp(`:table/.*"Ref":"${table}"`)), ['dynamodb:GetItem', 'dynamodb:UpdateItem']],
      [expect.stringMatching(/:execution:Stack-Workflow-[0-9A-F]{8}:\*"/), ['states:DescribeExecution']],
    ]);
  });

  test('one key function per stack, shared by its idempotent workflows, with its own role and no permission beyond its logs', () => {
    const stack = newStack();
    const a = idempotent({}, stack).workflow;
    const b = new ConcurrencyControlledWorkflow(stack, 'Other', { body: new sfn.Pass(stack, 'OtherWork'), idempotency: {} });
    const template = Template.fromStack(stack);
    expect(Object.keys(template.findResources('AWS::Lambda::Function')).filter((id) => id.startsWith('CdkSfnSemaphoreIdempotencyKey'))).toHaveLength(1);
    expect(a.keyFunction).toBeDefined();
    expect(b.idempotencyTable).toBeDefined();
    const keyFunctionStatements = policyStatements(stack, 'CdkSfnSemaphoreIdempotencyKeyRole');
    expect(keyFunctionStatements.flatMap((st) => [st.Action].flat()).sort()).toEqual(['logs:CreateLogStream', 'logs:PutLogEvents']);
  });

  test('a key function per runtime: workflows choosing the same runtime share one, a bad runtime is refused', () => {
    const stack = newStack();
    const nodejs24 = new lambda.Runtime('nodejs24.x', lambda.RuntimeFamily.NODEJS);
    idempotent({}, stack);
    new ConcurrencyControlledWorkflow(stack, 'Other', { body: new sfn.Pass(stack, 'OtherWork'), idempotency: { keyFunctionRuntime: nodejs24 } });
    new ConcurrencyControlledWorkflow(stack, 'Third', { body: new sfn.Pass(stack, 'ThirdWork'), idempotency: { keyFunctionRuntime: nodejs24 } });
    const functions = Template.fromStack(stack).findResources('AWS::Lambda::Function');
    const runtimes = Object.entries(functions)
      .filter(([id]) => id.startsWith('CdkSfnSemaphoreIdempotencyKey'))
      .map(([, fn]) => fn.Properties.Runtime)
      .sort();
    expect(runtimes).toEqual(['nodejs22.x', 'nodejs24.x']);
    expect(() => idempotent({ keyFunctionRuntime: lambda.Runtime.NODEJS_20_X })).toThrow(
      /keyFunctionRuntime must be a Node.js runtime, nodejs22.x or newer .*got nodejs20.x/,
    );
  });

  test('the records table: partition key id, TTL on expiresAt, retained, point-in-time recovery; a customer key is granted', () => {
    const stack = newStack();
    const encryptionKey = new kms.Key(stack, 'Key');
    const table = new IdempotencyTable(stack, 'Records', { encryptionKey });
    const { workflow } = idempotent({ table }, stack);
    const template = Template.fromStack(stack);
    template.hasResource('AWS::DynamoDB::Table', {
      DeletionPolicy: 'Retain',
      Properties: {
        KeySchema: [{ AttributeName: 'id', KeyType: 'HASH' }],
        TimeToLiveSpecification: { AttributeName: 'expiresAt', Enabled: true },
        PointInTimeRecoverySpecification: { PointInTimeRecoveryEnabled: true },
        SSESpecification: { SSEEnabled: true, SSEType: 'KMS' },
      },
    });
    expect(workflow.table).toBe(table);
    const kmsActions = policyStatements(stack, 'WorkflowStateMachineRole').flatMap((st) => [st.Action].flat()).filter((a: string) => a.startsWith('kms:'));
    expect(kmsActions).toEqual(expect.arrayContaining(['kms:Decrypt', 'kms:Encrypt']));
  });

  test('an imported table, and an empty name rejected', () => {
    const stack = newStack();
    const imported = IdempotencyTable.fromTableName(stack, 'Imported', 'records');
    expect(imported.tableName).toBe('records');
    expect(() => IdempotencyTable.fromTableName(stack, 'Empty', '')).toThrow('`tableName` must not be empty');
  });

  test('a state machine name given by the user is kept, and the describe permission follows it', () => {
    const { stack } = idempotent({ stateMachineName: 'payments' });
    const describe = policyStatements(stack, 'WorkflowStateMachineRole').find((st) => st.Action === 'states:DescribeExecution');
    expect(JSON.stringify(describe.Resource)).toContain('execution:payments:*');
  });

  test('a timeout longer than a week keeps completed records in the table that much longer (TTL margin)', () => {
    // The key function's payload, as the definition (a string, maybe joined with tokens) spells it.
    const ttlMargin = (stack: Stack) => /ttlMarginSeconds\\*":(\d+)/.exec(JSON.stringify(Template.fromStack(stack).toJSON()))?.[1];
    expect(ttlMargin(idempotent({ timeout: Duration.days(30) }).stack)).toBe(String(31 * 86400));
    expect(ttlMargin(idempotent().stack)).toBeUndefined();
  });
});

describe('the key', () => {
  test('field paths: dots, quoted names, indexes; anything else is refused', () => {
    expect(parseFieldPath('$')).toEqual([]);
    expect(parseFieldPath("$.a.b_c['d e'][\"f\"][2]")).toEqual(['a', 'b_c', 'd e', 'f', 2]);
    for (const bad of ['a', '$.', '$..a', '$.a[*]', "$['a]", '$.a[-1]', '$.a.']) {
      expect(parseFieldPath(bad)).toBeUndefined();
    }
  });

  test('canonical JSON sorts keys at every level and keeps array order', () => {
    expect(canonicalJson({ b: 1, a: { d: [3, { z: 1, y: 2 }], c: null } })).toBe('{"a":{"c":null,"d":[3,{"y":2,"z":1}]},"b":1}');
    expect(canonicalJson([2, 1])).not.toBe(canonicalJson([1, 2]));
  });

  test('selection: missing fields are null, all missing or null is nothing, JMESPath null is nothing', () => {
    const input = { a: 1, b: { c: [10, 20] }, n: null };
    expect(select(input, { kind: 'fields', paths: ['$.a', '$.b.c[1]', '$.x'] })).toEqual([1, 20, null]);
    expect(select(input, { kind: 'fields', paths: ['$.x', '$.a.b', '$.b.c.d'] })).toBeUndefined();
    // An explicit null is no key either (as in JMESPath): { orderId: null } must not share one key with every such input.
    expect(select(input, { kind: 'fields', paths: ['$.n', '$.x'] })).toBeUndefined();
    expect(select(input, { kind: 'fields', paths: ['$.n', '$.a'] })).toEqual([null, 1]);
    expect(select(input, { kind: 'jmespath', expression: 'b.c[0]' })).toBe(10);
    expect(select(input, { kind: 'jmespath', expression: 'nothing' })).toBeUndefined();
    // A list or hash of missing fields selects nothing either: it is not a key all such inputs share.
    expect(select({ customer: 'y' }, { kind: 'jmespath', expression: '[orderId, items[].sku]' })).toBeUndefined();
    expect(select({ customer: 'y' }, { kind: 'jmespath', expression: '{o: orderId, c: nope}' })).toBeUndefined();
    expect(select({ orderId: 1 }, { kind: 'jmespath', expression: '[orderId, items[].sku]' })).toEqual([1, null]);
    expect(select({ orderId: null, items: [] }, { kind: 'jmespath', expression: '[orderId, items]' })).toEqual([null, []]);
  });

  test('key, validation hash and expiry', () => {
    const now = Date.UTC(2026, 10, 23, 12, 0, 0, 250);
    const event = { input: { id: 1, amount: 5 }, prefix: 'wf', key: { kind: 'fields' as const, paths: ['$.id'] }, expiresAfterSeconds: 3600 };
    const result = computeKey(event, now);
    expect(result.key).toMatch(/^wf#[0-9a-f]{64}$/);
    expect(result.validation).toBe(NO_VALIDATION);
    expect(result.notBeforeIso).toBe('2026-11-23T11:00:00.250Z');
    expect(result.expiresAt).toBe(Math.ceil(now / 1000) + 3600 + 7 * 86400);
    expect(result.payload).toBe(event.input);
    expect(result.inProgressExpiresAt).toBe(Math.ceil(now / 1000) + 366 * 86400);
    expect(result.waits).toEqual({ count: 0 });
    expect(result.missingOwner).toBe('');
    // A workflow that may run longer than a week keeps its completed records past its timeout.
    expect(computeKey({ ...event, ttlMarginSeconds: 30 * 86400 }, now).expiresAt).toBe(Math.ceil(now / 1000) + 3600 + 30 * 86400);
    expect(computeKey({ ...event, ttlMarginSeconds: 3600 }, now).expiresAt).toBe(result.expiresAt);

    const validated = computeKey({ ...event, validate: { kind: 'fields', paths: ['$.amount'] } }, now);
    const changed = computeKey({ ...event, input: { id: 1, amount: 6 }, validate: { kind: 'fields', paths: ['$.amount'] } }, now);
    expect(validated.key).toBe(result.key);
    expect(changed.key).toBe(result.key);
    expect(validated.validation).toMatch(/^[0-9a-f]{64}$/);
    expect(changed.validation).not.toBe(validated.validation);

    expect(() => computeKey({ ...event, input: { other: 1 } }, now)).toThrow(
      expect.objectContaining({ name: 'IdempotencyKeyMissing', message: expect.stringContaining('fields $.id') }),
    );
  });
});
