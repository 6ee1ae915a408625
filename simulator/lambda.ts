import * as fs from 'fs';
import { createRequire } from 'module';
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

/**
 * The node_modules directory that holds the AWS SDK v3, which the Lambda runtime provides to bundles
 * that leave it out: this repository's, or the one the installed package's dependencies are in.
 */
function sdkNodeModules(): string {
  const sdk = require.resolve('@aws-sdk/client-dynamodb/package.json');
  return sdk.slice(0, sdk.lastIndexOf(`${path.sep}@aws-sdk${path.sep}`));
}

/**
 * Load a CommonJS module whose `Date` is the simulation's clock (`Date.now()` and `new Date()` give
 * simulated time, and a date made outside the module is still `instanceof Date`), so that code
 * comparing timestamps written by state machines sees one clock, and
 * whose `console` writes to `log` (as a function's output goes to its log group).
 */
function loadWithClock(file: string, clock: () => number, log: (line: string) => void): Record<string, unknown> {
  const RealDate = Date;
  class SimulatedDate extends RealDate {
    public static now(): number {
      return clock();
    }
    /**
     * Every date is a Date: the AWS SDK, loaded outside the module, parses timestamps (a
     * DescribeExecution's stopDate) into the real Date, which `value instanceof Date` in the module must
     * accept, as it does on Lambda, where there is one Date.
     */
    public static [Symbol.hasInstance](value: unknown): boolean {
      return value instanceof RealDate;
    }
    constructor(...args: unknown[]) {
      if (args.length === 0) super(clock());
      else super(...(args as [number]));
    }
  }
  const format = (args: unknown[]) => args.map((a) => (typeof a === 'string' ? a : JSON.stringify(a))).join(' ');
  const write = (...a: unknown[]) => log(format(a));
  const logConsole = { log: write, info: write, warn: write, error: write, debug: write };
  const wrapper = new Function('exports', 'require', 'module', '__filename', '__dirname', 'Date', 'console', fs.readFileSync(file, 'utf-8'));
  const mod = { exports: {} as Record<string, unknown> };
  wrapper(mod.exports, createRequire(file), mod, file, path.dirname(file), SimulatedDate, logConsole);
  return mod.exports;
}

/** Load the handler of an `AWS::Lambda::Function` from the cloud assembly in `assemblyDir`. */
export function loadHandler(resource: CfnResource, assemblyDir: string, clock: () => number, log: (line: string) => void): LambdaHandler {
  const props = resource.Properties ?? {};
  const [file, exportName] = splitHandler(String(props.Handler));
  let codeDir: string;
  if (typeof props.Code?.ZipFile === 'string') {
    codeDir = fs.mkdtempSync(path.join(os.tmpdir(), 'sim-inline-'));
    fs.writeFileSync(path.join(codeDir, `${file}.js`), props.Code.ZipFile);
  } else {
    const key = String(props.Code?.S3Key ?? '');
    const hash = key.replace(/\.zip$/, '');
    // Staged as asset.<hash>, plus the source directory's extension if it has one.
    const staged = fs.readdirSync(assemblyDir).find((name) => name === `asset.${hash}` || name.startsWith(`asset.${hash}.`));
    if (!staged) {
      throw new Error(`the simulator found no asset directory asset.${hash}* in ${assemblyDir} for the Lambda function code ${key}`);
    }
    codeDir = path.join(assemblyDir, staged);
  }
  // The runtime provides the AWS SDK; here it comes from the node_modules that has it.
  const modules = path.join(codeDir, 'node_modules');
  if (!fs.existsSync(modules)) {
    fs.symlinkSync(sdkNodeModules(), modules, 'dir');
  }
  const mod = loadWithClock(path.join(codeDir, `${file}.js`), clock, log);
  const handler = mod[exportName] as LambdaHandler;
  if (typeof handler !== 'function') {
    throw new Error(`${props.Handler} does not export a function`);
  }
  return handler;
}

function splitHandler(handler: string): [string, string] {
  const dot = handler.lastIndexOf('.');
  return [handler.slice(0, dot), handler.slice(dot + 1)];
}
