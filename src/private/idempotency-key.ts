import { createHash } from 'crypto';
import * as jmespath from 'jmespath';

/*
 * How an idempotency key is computed from an execution input. Shared by the constructs (which check
 * the configuration at synth time) and the key function in lambda/ (which applies it), so that both
 * accept exactly the same paths and expressions.
 *
 * Keys and validation hashes are SHA-256 over a canonical JSON text: object keys sorted at every
 * level, so the order of keys inside the input never changes the key. (States.Hash over
 * States.JsonToString would keep the input's key order, and takes at most 10,000 characters.)
 */

/** What the key (or the validation hash) covers, as passed to the key function. */
export interface KeySelection {
  /** `input`: the whole input; `fields`: values at JSONPaths; `jmespath`: one JMESPath expression. */
  readonly kind: 'input' | 'fields' | 'jmespath';
  /** The JSONPaths, for `fields`. */
  readonly paths?: string[];
  /** The expression, for `jmespath`. */
  readonly expression?: string;
}

/** The event the key function receives: the execution input and the workflow's configuration. */
export interface KeyFunctionEvent {
  readonly input: unknown;
  /** Prefix of every key of this workflow, so that workflows can share a table. */
  readonly prefix: string;
  readonly key: KeySelection;
  /** What the validation hash covers. @default - no validation hash */
  readonly validate?: KeySelection;
  readonly expiresAfterSeconds: number;
  /**
   * How long past its start an execution may still complete its record (the workflow's timeout, if
   * it has one), so that DynamoDB TTL never deletes a completed record before it expires.
   * @default - a week (COMPLETED_TTL_MARGIN_SECONDS)
   */
  readonly ttlMarginSeconds?: number;
}

/** What the key function returns; the state machine keeps it as its state data. */
export interface KeyFunctionResult {
  /** The execution input, unchanged (the body receives it; its output then takes its place). */
  readonly payload: unknown;
  /** `<prefix>#<sha-256 hex>`. */
  readonly key: string;
  /** SHA-256 hex of the validated fields, or `-` when nothing is validated. */
  readonly validation: string;
  /**
   * Completed records that finished before this instant (now minus `expiresAfter`, ISO-8601 with
   * milliseconds, comparable with `$$.State.EnteredTime`) no longer count.
   */
  readonly notBeforeIso: string;
  /**
   * TTL of a record this execution completes, epoch seconds: now plus `expiresAfter` plus a margin for
   * the execution's own run time (a week, or the workflow's timeout if longer). TTL only cleans up;
   * expiry is checked by `notBeforeIso`.
   */
  readonly expiresAt: number;
  /**
   * TTL of an IN_PROGRESS record, epoch seconds: a year and a day from now, longer than any Standard
   * execution runs, so that DynamoDB never deletes the record of a running execution.
   */
  readonly inProgressExpiresAt: number;
  /** How often a duplicate has waited for the first execution: a counter the states increment. */
  readonly waits: { readonly count: number };
  /**
   * The owner of an IN_PROGRESS record that DescribeExecution last reported as not existing (`''`:
   * none). DescribeExecution is eventually consistent, so a duplicate takes over from a missing owner
   * only when it is reported missing a second time, one poll later.
   */
  readonly missingOwner: string;
}

/** A year and a day: Standard executions run at most a year. */
const IN_PROGRESS_TTL_SECONDS = 366 * 24 * 3600;

/** Run time allowed for before DynamoDB TTL may delete a completed record: a week. */
export const COMPLETED_TTL_MARGIN_SECONDS = 7 * 24 * 3600;

/** The value of `validation` when no fields are validated. */
export const NO_VALIDATION = '-';

/** Error of an execution whose key selects nothing (every field missing or null, or the expression gives only nulls). */
export const KEY_MISSING_ERROR = 'IdempotencyKeyMissing';

type Segment = string | number;

/**
 * Parse the JSONPath subset we accept: `$` followed by `.name`, `['name']`, `["name"]` or `[index]`
 * segments. Returns undefined when the path is not of that form.
 */
export function parseFieldPath(path: string): Segment[] | undefined {
  if (!path.startsWith('$')) return undefined;
  const segments: Segment[] = [];
  const re = /\.([A-Za-z_][A-Za-z0-9_-]*)|\['((?:[^'\\]|\\.)*)'\]|\["((?:[^"\\]|\\.)*)"\]|\[(\d+)\]/y;
  re.lastIndex = 1;
  while (re.lastIndex < path.length) {
    const m = re.exec(path);
    if (!m) return undefined;
    if (m[1] !== undefined) segments.push(m[1]);
    else if (m[2] !== undefined) segments.push(m[2].replace(/\\(.)/g, '$1'));
    else if (m[3] !== undefined) segments.push(m[3].replace(/\\(.)/g, '$1'));
    else segments.push(Number(m[4]));
  }
  return segments;
}

/** Why a JMESPath expression does not compile, or undefined when it does. */
export function jmesPathError(expression: string): string | undefined {
  try {
    // jmespath parses without evaluating in compile(), which its typings leave out.
    (jmespath as unknown as { compile(expression: string): unknown }).compile(expression);
    return undefined;
  } catch (e) {
    return (e as Error).message;
  }
}

/** The value at a parsed path, or undefined when the input has nothing there. */
function valueAt(input: unknown, segments: Segment[]): unknown {
  let value: unknown = input;
  for (const segment of segments) {
    if (value === null || typeof value !== 'object') return undefined;
    if (typeof segment === 'number' ? !Array.isArray(value) : Array.isArray(value)) return undefined;
    value = (value as Record<string | number, unknown>)[segment];
    if (value === undefined) return undefined;
  }
  return value;
}

/**
 * What a selection picks from the input: the input itself, the list of field values (null where a
 * field is missing), or the expression's result. Undefined when it picks nothing at all.
 */
export function select(input: unknown, selection: KeySelection): unknown {
  switch (selection.kind) {
    case 'input':
      return input;
    case 'fields': {
      const values = (selection.paths ?? []).map((p) => {
        const segments = parseFieldPath(p);
        if (!segments) throw new Error(`not a supported JSONPath: ${p}`);
        return valueAt(input, segments);
      });
      // Nothing but missing or null fields selects nothing, as a JMESPath result of nothing but nulls.
      return values.every((v) => v === undefined || v === null) ? undefined : values.map((v) => (v === undefined ? null : v));
    }
    case 'jmespath': {
      // `[a, b]` over an input without a and b gives [null, null], not null: that selects nothing too.
      const value: unknown = jmespath.search(input, selection.expression ?? '@');
      return onlyNulls(value) ? undefined : value;
    }
  }
}

/** null, or an array or object that holds nothing but nulls (at any depth). */
function onlyNulls(value: unknown): boolean {
  if (value === null || value === undefined) return true;
  if (typeof value !== 'object') return false;
  const values = Array.isArray(value) ? value : Object.values(value as Record<string, unknown>);
  return values.length > 0 && values.every(onlyNulls);
}

/** JSON text with the keys of every object sorted, so that equal values give equal text. */
export function canonicalJson(value: unknown): string {
  if (Array.isArray(value)) return `[${value.map(canonicalJson).join(',')}]`;
  if (value !== null && typeof value === 'object') {
    const entries = Object.entries(value as Record<string, unknown>)
      .filter(([, v]) => v !== undefined)
      .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
    return `{${entries.map(([k, v]) => `${JSON.stringify(k)}:${canonicalJson(v)}`).join(',')}}`;
  }
  return JSON.stringify(value ?? null);
}

export function sha256(text: string): string {
  return createHash('sha256').update(text, 'utf8').digest('hex');
}

/** Compute key, validation hash and expiry for an execution input, at `nowMillis`. */
export function computeKey(event: KeyFunctionEvent, nowMillis: number): KeyFunctionResult {
  const selected = select(event.input, event.key);
  if (selected === undefined) {
    const error = new Error(`The idempotency key selects nothing from the execution input (${describeSelection(event.key)})`);
    error.name = KEY_MISSING_ERROR;
    throw error;
  }
  const validated = event.validate === undefined ? undefined : select(event.input, event.validate);
  return {
    payload: event.input,
    key: `${event.prefix}#${sha256(canonicalJson(selected))}`,
    validation: event.validate === undefined ? NO_VALIDATION : sha256(canonicalJson(validated ?? null)),
    notBeforeIso: new Date(nowMillis - event.expiresAfterSeconds * 1000).toISOString(),
    expiresAt: Math.ceil(nowMillis / 1000) + event.expiresAfterSeconds + Math.max(COMPLETED_TTL_MARGIN_SECONDS, event.ttlMarginSeconds ?? 0),
    inProgressExpiresAt: Math.ceil(nowMillis / 1000) + IN_PROGRESS_TTL_SECONDS,
    waits: { count: 0 },
    missingOwner: '',
  };
}

function describeSelection(selection: KeySelection): string {
  switch (selection.kind) {
    case 'input':
      return 'the whole input';
    case 'fields':
      return `fields ${(selection.paths ?? []).join(', ')}`;
    case 'jmespath':
      return `JMESPath ${selection.expression}`;
  }
}
