import { App, RemovalPolicy, Stack } from 'aws-cdk-lib';
import { Match, Template } from 'aws-cdk-lib/assertions';
import * as dynamodb from 'aws-cdk-lib/aws-dynamodb';
import * as iam from 'aws-cdk-lib/aws-iam';
import * as kms from 'aws-cdk-lib/aws-kms';
import * as sfn from 'aws-cdk-lib/aws-stepfunctions';
import { ConcurrencyControlledWorkflow, SemaphoreTable } from '../src';

function newStack() {
  return new Stack(new App(), 'Stack');
}

describe('SemaphoreTable', () => {
  test('is on-demand, keyed by lockName, with point-in-time recovery and encryption, retained by default', () => {
    // GIVEN
    const stack = newStack();

    // WHEN
    new SemaphoreTable(stack, 'Locks');

    // THEN
    const template = Template.fromStack(stack);
    template.hasResource('AWS::DynamoDB::Table', {
      Properties: {
        KeySchema: [{ AttributeName: 'lockName', KeyType: 'HASH' }],
        AttributeDefinitions: [{ AttributeName: 'lockName', AttributeType: 'S' }],
        BillingMode: 'PAY_PER_REQUEST',
        PointInTimeRecoverySpecification: { PointInTimeRecoveryEnabled: true },
        SSESpecification: { SSEEnabled: true },
      },
      DeletionPolicy: 'Retain',
      UpdateReplacePolicy: 'Retain',
    });
    expect(SemaphoreTable.PARTITION_KEY).toBe('lockName');
  });

  test('takes a removal policy, a name, a customer-managed key and deletion protection', () => {
    const stack = newStack();
    const key = new kms.Key(stack, 'Key');

    new SemaphoreTable(stack, 'Locks', {
      tableName: 'my-locks',
      removalPolicy: RemovalPolicy.DESTROY,
      encryptionKey: key,
      deletionProtection: true,
      pointInTimeRecovery: false,
    });

    Template.fromStack(stack).hasResource('AWS::DynamoDB::Table', {
      Properties: {
        TableName: 'my-locks',
        DeletionProtectionEnabled: true,
        PointInTimeRecoverySpecification: { PointInTimeRecoveryEnabled: false },
        SSESpecification: { SSEEnabled: true, SSEType: 'KMS', KMSMasterKeyId: Match.anyValue() },
      },
      DeletionPolicy: 'Delete',
    });
  });

  test('fails for a customer-managed key with another encryption type', () => {
    const stack = newStack();
    const key = new kms.Key(stack, 'Key');
    expect(
      () => new SemaphoreTable(stack, 'Locks', { encryptionKey: key, encryption: dynamodb.TableEncryption.AWS_MANAGED }),
    ).toThrow(/`encryptionKey` requires `encryption` to be TableEncryption.CUSTOMER_MANAGED or unset, got: AWS_MANAGED/);
  });

  test('grants acquire/release as UpdateItem on this table only, and reads as read actions', () => {
    const stack = newStack();
    const table = new SemaphoreTable(stack, 'Locks');
    const role = new iam.Role(stack, 'Role', { assumedBy: new iam.AccountRootPrincipal() });

    table.grantAcquireRelease(role);
    table.grantReadLocks(role);

    const statements = Template.fromStack(stack).findResources('AWS::IAM::Policy');
    const [policy] = Object.values(statements);
    const stmts = policy.Properties.PolicyDocument.Statement;
    expect(stmts[0]).toEqual({
      Action: 'dynamodb:UpdateItem',
      Effect: 'Allow',
      Resource: [{ 'Fn::GetAtt': [expect.stringMatching(/^LocksTable/), 'Arn'] }, { Ref: 'AWS::NoValue' }],
    });
    expect(stmts[1].Action).toEqual(expect.arrayContaining(['dynamodb:GetItem', 'dynamodb:Scan', 'dynamodb:Query']));
    expect(stmts[1].Action).not.toContain('dynamodb:UpdateItem');
  });

  test('grants a client (the CLI) UpdateItem, GetItem and DeleteItem on this table, the key, and SendTaskSuccess to wake queued executions', () => {
    const stack = newStack();
    const role = new iam.Role(stack, 'Role', { assumedBy: new iam.AccountRootPrincipal() });
    const key = new kms.Key(stack, 'Key');
    const table = new SemaphoreTable(stack, 'Locks', { encryptionKey: key });
    table.grantClient(role);
    // A queue workflow on the table, defined after the grant: the client may wake its executions.
    const workflow = new ConcurrencyControlledWorkflow(stack, 'Workflow', { table, lockName: 'shared', body: new sfn.Pass(stack, 'Work') });

    const stmts = (Object.values(Template.fromStack(stack).findResources('AWS::IAM::Policy')) as any[])
      .filter((policy) => policy.Properties.Roles.some((r: any) => r.Ref.startsWith('Role')))
      .flatMap((policy) => policy.Properties.PolicyDocument.Statement);
    expect(stmts).toContainEqual({
      Action: ['dynamodb:UpdateItem', 'dynamodb:GetItem', 'dynamodb:DeleteItem'],
      Effect: 'Allow',
      Resource: [{ 'Fn::GetAtt': [expect.stringMatching(/^LocksTable/), 'Arn'] }, { Ref: 'AWS::NoValue' }],
    });
    expect(stmts).toContainEqual({
      Action: 'states:SendTaskSuccess',
      Effect: 'Allow',
      Resource: { Ref: stack.getLogicalId(workflow.stateMachine.node.defaultChild as any) },
    });
    expect(stmts).toContainEqual(expect.objectContaining({ Action: expect.arrayContaining(['kms:Decrypt', 'kms:Encrypt']) }));
    // Nothing else: no Scan, no other service (DeleteItem: a served ticket once its waiter is woken).
    expect(stmts.flatMap((st: any) => [st.Action].flat()).filter((a: string) => !a.startsWith('kms:')).sort()).toEqual([
      'dynamodb:DeleteItem',
      'dynamodb:GetItem',
      'dynamodb:UpdateItem',
      'states:SendTaskSuccess',
    ]);
  });

  test('imports an existing table by name', () => {
    const stack = newStack();
    const role = new iam.Role(stack, 'Role', { assumedBy: new iam.AccountRootPrincipal() });

    const table = SemaphoreTable.fromTableName(stack, 'Existing', 'existing-locks');
    table.grantAcquireRelease(role);

    expect(stack.resolve(table.tableName)).toBe('existing-locks');
    Template.fromStack(stack).resourceCountIs('AWS::DynamoDB::Table', 0);
    Template.fromStack(stack).hasResourceProperties('AWS::IAM::Policy', {
      PolicyDocument: {
        Statement: [
          Match.objectLike({
            Action: 'dynamodb:UpdateItem',
            Resource: Match.arrayWith([
              {
                'Fn::Join': ['', ['arn:', { Ref: 'AWS::Partition' }, ':dynamodb:', { Ref: 'AWS::Region' }, ':', { Ref: 'AWS::AccountId' }, ':table/existing-locks']],
              },
            ]),
          }),
        ],
      },
    });
  });

  test('an imported table with a customer managed key: every role that uses the locks gets the key', () => {
    const stack = newStack();
    const key = new kms.Key(stack, 'Key');
    const table = SemaphoreTable.fromTableAttributes(stack, 'Existing', { tableName: 'encrypted-locks', encryptionKey: key });
    const body = new sfn.Pass(stack, 'Work');
    const workflow = new ConcurrencyControlledWorkflow(stack, 'Workflow', { body, table });
    const script = new iam.Role(stack, 'Script', { assumedBy: new iam.AccountRootPrincipal() });
    table.grantClient(script);

    const template = Template.fromStack(stack);
    template.resourceCountIs('AWS::DynamoDB::Table', 0);
    const keyId = stack.getLogicalId(key.node.defaultChild as kms.CfnKey);
    const roles = [workflow.stateMachine.role, workflow.cleanupStateMachine.role, workflow.reconciler.reconcilerFunction.role!, script];
    for (const role of roles) {
      const roleId = stack.getLogicalId(role.node.defaultChild as iam.CfnRole);
      const policies = Object.values(template.findResources('AWS::IAM::Policy')).filter((p: any) => JSON.stringify(p.Properties.Roles).includes(roleId));
      const statements = policies.flatMap((p: any) => p.Properties.PolicyDocument.Statement);
      const onKey = statements.filter((st: any) => JSON.stringify(st.Resource).includes(keyId));
      expect([roleId, onKey.flatMap((st: any) => [st.Action].flat())]).toEqual([roleId, expect.arrayContaining(['kms:Decrypt', 'kms:Encrypt'])]);
    }
  });

  test('fails to import a table without a name', () => {
    expect(() => SemaphoreTable.fromTableName(newStack(), 'Existing', '')).toThrow(/`tableName` must not be empty/);
  });
});
