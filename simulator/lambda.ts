import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';
import { CfnResource } from './cfn';

/*
 * Runs Lambda functions of the synthesized stack in this process, from their synthesized code: an
 * asset directory of the cloud assembly (for example an esbuild bundle) or inline code. The handler
 * sees its environment variables, plus the endpoints of the simulator's DynamoDB and Step Functions,
 * so that the AWS SDK inside it talks to the simulation.
 */

export type LambdaHandler = (event: unknown, context: LambdaContext) => Promise<unknown>;

/** The parts of the Lambda context object handlers use. */
export interface LambdaContext {
  readonly functionName: string;
  readonly awsRequestId: string;
  getRemainingTimeInMillis(): number;
}

const REPO_NODE_MODULES = path.resolve(__dirname, '..', 'node_modules');

/** Load the handler of an `AWS::Lambda::Function` from the cloud assembly in `assemblyDir`. */
export function loadHandler(resource: CfnResource, assemblyDir: string): LambdaHandler {
  const props = resource.Properties ?? {};
  const [file, exportName] = splitHandler(String(props.Handler));
  let codeDir: string;
  if (typeof props.Code?.ZipFile === 'string') {
    codeDir = fs.mkdtempSync(path.join(os.tmpdir(), 'sim-inline-'));
    fs.writeFileSync(path.join(codeDir, `${file}.js`), props.Code.ZipFile);
  } else {
    const key = String(props.Code?.S3Key ?? '');
    const hash = key.replace(/\.zip$/, '');
    codeDir = path.join(assemblyDir, `asset.${hash}`);
    if (!fs.existsSync(codeDir)) {
      throw new Error(`the simulator found no asset directory ${codeDir} for the Lambda function code ${key}`);
    }
  }
  // The runtime provides the AWS SDK; here it comes from the repository's node_modules.
  const modules = path.join(codeDir, 'node_modules');
  if (!fs.existsSync(modules)) {
    fs.symlinkSync(REPO_NODE_MODULES, modules, 'dir');
  }
  // eslint-disable-next-line @typescript-eslint/no-require-imports
  const mod = require(path.join(codeDir, file));
  const handler = mod[exportName];
  if (typeof handler !== 'function') {
    throw new Error(`${props.Handler} does not export a function`);
  }
  return handler;
}

function splitHandler(handler: string): [string, string] {
  const dot = handler.lastIndexOf('.');
  return [handler.slice(0, dot), handler.slice(dot + 1)];
}
