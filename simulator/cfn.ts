/*
 * Just enough of CloudFormation to turn a synthesized template into the values the simulator runs:
 * physical names and ARNs for every resource, and the intrinsic functions CDK emits in state machine
 * definitions and rules (Ref, Fn::GetAtt, Fn::Join, Fn::Select, Fn::Split, Fn::Sub).
 */

export const ACCOUNT = '123456789012';
export const REGION = 'us-east-1';
export const PARTITION = 'aws';

export interface CfnResource {
  readonly Type: string;
  readonly Properties?: Record<string, any>;
}

export interface CfnTemplate {
  readonly Resources: Record<string, CfnResource>;
}

/** What a resource resolves to. */
export interface PhysicalResource {
  readonly logicalId: string;
  readonly type: string;
  /** The value of `Ref`. */
  readonly ref: string;
  /** Values of `Fn::GetAtt`. */
  readonly attributes: Record<string, string>;
}

/** Physical names and ARNs, the way CloudFormation would assign them in our fake account. */
export function physicalResources(template: CfnTemplate, stackName: string): Map<string, PhysicalResource> {
  const result = new Map<string, PhysicalResource>();
  for (const [logicalId, resource] of Object.entries(template.Resources)) {
    const props = resource.Properties ?? {};
    const generated = `${stackName}-${logicalId}`;
    let refValue = generated;
    let attributes: Record<string, string> = {};
    switch (resource.Type) {
      case 'AWS::DynamoDB::Table': {
        const name = literal(props.TableName) ?? generated;
        refValue = name;
        attributes = { Arn: `arn:${PARTITION}:dynamodb:${REGION}:${ACCOUNT}:table/${name}` };
        break;
      }
      case 'AWS::StepFunctions::StateMachine': {
        const name = literal(props.StateMachineName) ?? generated;
        refValue = `arn:${PARTITION}:states:${REGION}:${ACCOUNT}:stateMachine:${name}`;
        attributes = { Arn: refValue, Name: name };
        break;
      }
      case 'AWS::Lambda::Function': {
        const name = literal(props.FunctionName) ?? generated;
        refValue = name;
        attributes = { Arn: `arn:${PARTITION}:lambda:${REGION}:${ACCOUNT}:function:${name}` };
        break;
      }
      case 'AWS::SQS::Queue': {
        const name = literal(props.QueueName) ?? generated;
        refValue = `https://sqs.${REGION}.amazonaws.com/${ACCOUNT}/${name}`;
        attributes = { Arn: `arn:${PARTITION}:sqs:${REGION}:${ACCOUNT}:${name}`, QueueName: name };
        break;
      }
      case 'AWS::IAM::Role': {
        refValue = generated;
        attributes = { Arn: `arn:${PARTITION}:iam::${ACCOUNT}:role/${generated}` };
        break;
      }
      case 'AWS::Logs::LogGroup': {
        refValue = generated;
        attributes = { Arn: `arn:${PARTITION}:logs:${REGION}:${ACCOUNT}:log-group:${generated}:*` };
        break;
      }
      case 'AWS::Events::Rule': {
        refValue = generated;
        attributes = { Arn: `arn:${PARTITION}:events:${REGION}:${ACCOUNT}:rule/${generated}` };
        break;
      }
      default:
        attributes = { Arn: `arn:${PARTITION}:unknown:${REGION}:${ACCOUNT}:${generated}` };
    }
    result.set(logicalId, { logicalId, type: resource.Type, ref: refValue, attributes });
  }
  return result;
}

function literal(x: unknown): string | undefined {
  return typeof x === 'string' ? x : undefined;
}

/** Resolve every intrinsic function in `value`. */
export function resolve(value: any, resources: Map<string, PhysicalResource>, stackName: string): any {
  const recurse = (v: any): any => resolve(v, resources, stackName);
  if (Array.isArray(value)) {
    return value.map(recurse);
  }
  if (value === null || typeof value !== 'object') {
    return value;
  }
  const keys = Object.keys(value);
  if (keys.length === 1) {
    const [fn] = keys;
    const arg = value[fn];
    switch (fn) {
      case 'Ref':
        return ref(arg, resources, stackName);
      case 'Fn::GetAtt': {
        const [logicalId, attribute] = Array.isArray(arg) ? arg : String(arg).split('.');
        const resource = resources.get(logicalId);
        const attr = resource?.attributes[attribute];
        if (attr === undefined) {
          throw new Error(`cannot resolve Fn::GetAtt ${logicalId}.${attribute}`);
        }
        return attr;
      }
      case 'Fn::Join': {
        const [separator, parts] = arg;
        return (recurse(parts) as unknown[]).join(separator);
      }
      case 'Fn::Select': {
        const [index, list] = arg;
        return (recurse(list) as unknown[])[Number(recurse(index))];
      }
      case 'Fn::Split': {
        const [separator, source] = arg;
        return String(recurse(source)).split(separator);
      }
      case 'Fn::Sub': {
        const [template, vars] = Array.isArray(arg) ? arg : [arg, {}];
        const resolvedVars = recurse(vars);
        return String(template).replace(/\$\{([^}]+)\}/g, (_, name: string) => {
          if (name in resolvedVars) return resolvedVars[name];
          if (name.includes('.')) return recurse({ 'Fn::GetAtt': name.split('.') });
          return ref(name, resources, stackName);
        });
      }
      default:
        if (fn.startsWith('Fn::')) {
          throw new Error(`the simulator does not resolve ${fn}`);
        }
    }
  }
  return Object.fromEntries(keys.map((k) => [k, recurse(value[k])]));
}

function ref(name: string, resources: Map<string, PhysicalResource>, stackName: string): string {
  switch (name) {
    case 'AWS::Partition':
      return PARTITION;
    case 'AWS::Region':
      return REGION;
    case 'AWS::AccountId':
      return ACCOUNT;
    case 'AWS::URLSuffix':
      return 'amazonaws.com';
    case 'AWS::StackName':
      return stackName;
    case 'AWS::NoValue':
      return undefined as unknown as string;
  }
  const resource = resources.get(name);
  if (!resource) {
    throw new Error(`cannot resolve Ref ${name}`);
  }
  return resource.ref;
}
