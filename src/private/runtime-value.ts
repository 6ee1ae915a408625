import { IResolvable, Token, Tokenization } from 'aws-cdk-lib';

/*
 * `lockName` and `concurrencyLimit` are either values known at synth (or deploy) time, or
 * `JsonPath.stringAt(...)`/`JsonPath.numberAt(...)` tokens that read them from the execution input at
 * run time. These helpers tell the two apart and move a path between the places it is evaluated:
 * the protected workflow reads it from `$$.Execution.Input` (so it works after the body has replaced
 * the state data), the cleanup machine from the parsed input of the status-change event.
 */

// aws-stepfunctions marks its JSONPath tokens with this symbol (private/json-path.ts); it is stable
// across aws-cdk-lib 2.x and the only way to recover the path from an encoded token.
const JSON_PATH_TOKEN = Symbol.for('@aws-cdk/aws-stepfunctions.JsonPathToken');
/** The execution's input, in the context object (the same in every run of it). */
export const EXECUTION_INPUT = '$$.Execution.Input';

interface JsonPathTokenLike extends IResolvable {
  readonly path: string;
}

function isJsonPathToken(x: unknown): x is JsonPathTokenLike {
  return typeof x === 'object' && x !== null && (x as Record<symbol, unknown>)[JSON_PATH_TOKEN] === true;
}

/**
 * A value that is either fixed (literal or deploy-time token) or read from the execution input.
 */
export interface RuntimeValue<T> {
  /** The value, when it is not read from the input. */
  readonly fixed?: T;
  /** Path into the execution input, normalized to start with `$` (`$`, `$.a.b`, `$['a']`). */
  readonly inputPath?: string;
}

/** Interpret a string prop. Throws when the string mixes a JSONPath with other text. */
export function stringValue(prop: string, value: string): RuntimeValue<string> {
  if (!Token.isUnresolved(value)) {
    return { fixed: value };
  }
  const fragments = Tokenization.reverseString(value);
  const paths = fragments.tokens.filter(isJsonPathToken);
  if (paths.length === 0) {
    return { fixed: value };
  }
  if (fragments.length > 1) {
    throw new Error(
      `\`${prop}\` must be either a fixed string or exactly one JsonPath.stringAt(...) reference, got a string that concatenates a JSONPath with other text`,
    );
  }
  return { inputPath: normalizeInputPath(prop, paths[0].path) };
}

/** Interpret a number prop. */
export function numberValue(prop: string, value: number): RuntimeValue<number> {
  if (!Token.isUnresolved(value)) {
    return { fixed: value };
  }
  const token = Tokenization.reverseNumber(value);
  if (isJsonPathToken(token)) {
    return { inputPath: normalizeInputPath(prop, token.path) };
  }
  return { fixed: value };
}

function normalizeInputPath(prop: string, path: string): string {
  if (path === EXECUTION_INPUT || path.startsWith(`${EXECUTION_INPUT}.`) || path.startsWith(`${EXECUTION_INPUT}[`)) {
    return `$${path.slice(EXECUTION_INPUT.length)}`;
  }
  if (path.startsWith('$$')) {
    throw new Error(
      `\`${prop}\` can be read from the execution input only (a path starting with \`$.\` or \`$$.Execution.Input\`), got: ${path}`,
    );
  }
  if (path !== '$' && !path.startsWith('$.') && !path.startsWith('$[')) {
    throw new Error(`\`${prop}\` must be a JSONPath into the execution input starting with \`$.\`, got: ${path}`);
  }
  return path;
}

/** The path as seen from any state of the protected workflow. */
export function pathFromExecutionInput(inputPath: string): string {
  return `${EXECUTION_INPUT}${inputPath.slice(1)}`;
}

/** The path as seen from a state whose data holds the parsed execution input at `base`. */
export function pathFromParsedInput(inputPath: string, base: string): string {
  return `${base}${inputPath.slice(1)}`;
}
