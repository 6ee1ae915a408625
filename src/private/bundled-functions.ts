import * as path from 'path';
import { Token } from 'aws-cdk-lib';
import * as lambda from 'aws-cdk-lib/aws-lambda';
import { Construct } from 'constructs';

/**
 * The runtime of the library's functions unless the user chooses one: the newest Node.js runtime of the
 * aws-cdk-lib floor (2.211.0). Lambda deprecates it on 2027-04-30 and blocks creating functions on it from
 * 2027-06-01 (https://docs.aws.amazon.com/lambda/latest/dg/lambda-nodejs.html).
 */
export const DEFAULT_FUNCTION_RUNTIME = lambda.Runtime.NODEJS_22_X;

/**
 * The oldest Node.js major the bundles run on (esbuild's target in .projenrc.ts). Lambda blocks creating
 * functions on nodejs20.x since 2026-08-31 (same page), and the handlers need the AWS SDK v3 of the runtime.
 */
const OLDEST_NODE_MAJOR = 22;

/**
 * Refuses a runtime the bundled handlers cannot run on, naming the prop, the value and what is allowed.
 */
export function validateFunctionRuntime(prop: string, runtime: lambda.Runtime | undefined): lambda.Runtime {
  if (runtime === undefined) {
    return DEFAULT_FUNCTION_RUNTIME;
  }
  if (Token.isUnresolved(runtime.name)) {
    return runtime;
  }
  const major = /^nodejs(\d+)\.x$/.exec(runtime.name);
  if (runtime.family !== lambda.RuntimeFamily.NODEJS || !major || Number(major[1]) < OLDEST_NODE_MAJOR) {
    throw new Error(
      `${prop} must be a Node.js runtime, nodejs${OLDEST_NODE_MAJOR}.x or newer (for example lambda.Runtime.NODEJS_22_X, or ` +
        `new lambda.Runtime('nodejs24.x', lambda.RuntimeFamily.NODEJS) before aws-cdk-lib has it), got ${runtime.name}: ` +
        'the bundled handler is JavaScript built for that Node.js and uses the AWS SDK v3 the runtime provides',
    );
  }
  return runtime;
}

/** What a bundled function takes: the function options, and its runtime (already validated). */
export interface BundledFunctionProps extends lambda.FunctionOptions {
  readonly runtime: lambda.Runtime;
}

/**
 * A function running one of the handlers in lambda/, as esbuild bundled it into assets/lambda/<name>/.
 * The connection reuse variable is what the AWS SDK v3 does anyway; it is kept for older runtimes' sake.
 */
function bundledFunction(scope: Construct, id: string, bundle: string, props: BundledFunctionProps): lambda.Function {
  const fn = new lambda.Function(scope, id, {
    description: `lambda/${bundle}.ts`,
    ...props,
    handler: 'index.handler',
    code: lambda.Code.fromAsset(path.join(__dirname, '../../assets/lambda', bundle)),
  });
  fn.addEnvironment('AWS_NODEJS_CONNECTION_REUSE_ENABLED', '1', { removeInEdge: true });
  return fn;
}

/** The reconciler's function (lambda/reconciler.lambda.ts). */
export function reconcilerFunction(scope: Construct, id: string, props: BundledFunctionProps): lambda.Function {
  return bundledFunction(scope, id, 'reconciler.lambda', props);
}

/** The idempotency key function (lambda/idempotency-key.lambda.ts). */
export function idempotencyKeyFunction(scope: Construct, id: string, props: BundledFunctionProps): lambda.Function {
  return bundledFunction(scope, id, 'idempotency-key.lambda', props);
}
