/*
 * EventBridge rule matching and target input, as documented in the EventBridge user guide
 * ("Amazon EventBridge event patterns", "Content filtering in event patterns", "Transforming input"):
 * every field of the pattern must match; an array of values matches when the event's value (or any
 * element of it, when it is an array) matches one of them; objects in the array are content filters.
 */

export type EventPattern = Record<string, unknown>;

/** Whether `event` matches `pattern`. */
export function matchesPattern(pattern: EventPattern, event: Record<string, unknown>): boolean {
  return Object.entries(pattern).every(([key, rule]) => matchField(rule, event?.[key], key in (event ?? {})));
}

function matchField(rule: unknown, value: unknown, present: boolean): boolean {
  if (Array.isArray(rule)) {
    return rule.some((r) => matchValue(r, value, present));
  }
  if (rule !== null && typeof rule === 'object') {
    return value !== null && typeof value === 'object' && !Array.isArray(value) && matchesPattern(rule as EventPattern, value as Record<string, unknown>);
  }
  throw new Error(`invalid event pattern: leaf ${JSON.stringify(rule)} must be in an array`);
}

function matchValue(rule: unknown, value: unknown, present: boolean): boolean {
  if (rule !== null && typeof rule === 'object') {
    return matchFilter(rule as Record<string, unknown>, value, present);
  }
  if (!present) {
    return false;
  }
  const values = Array.isArray(value) ? value : [value];
  return values.some((v) => v === rule);
}

function matchFilter(filter: Record<string, unknown>, value: unknown, present: boolean): boolean {
  const [[op, arg]] = Object.entries(filter);
  const values = Array.isArray(value) ? value : [value];
  switch (op) {
    case 'exists':
      return arg ? present : !present;
    case 'prefix':
      return present && values.some((v) => typeof v === 'string' && v.startsWith(String(arg)));
    case 'suffix':
      return present && values.some((v) => typeof v === 'string' && v.endsWith(String(arg)));
    case 'equals-ignore-case':
      return present && values.some((v) => typeof v === 'string' && v.toLowerCase() === String(arg).toLowerCase());
    case 'anything-but': {
      if (!present) return false;
      if (arg !== null && typeof arg === 'object' && !Array.isArray(arg)) {
        return values.every((v) => !matchFilter(arg as Record<string, unknown>, v, true));
      }
      const excluded = Array.isArray(arg) ? arg : [arg];
      return values.every((v) => !excluded.includes(v));
    }
    case 'numeric': {
      if (!present) return false;
      const conditions = arg as Array<string | number>;
      return values.some((v) => typeof v === 'number' && numericMatch(conditions, v));
    }
    default:
      throw new Error(`the simulator does not support the content filter ${op}`);
  }
}

function numericMatch(conditions: Array<string | number>, v: number): boolean {
  for (let i = 0; i < conditions.length; i += 2) {
    const bound = Number(conditions[i + 1]);
    const ok = { '<': v < bound, '<=': v <= bound, '=': v === bound, '>': v > bound, '>=': v >= bound }[conditions[i] as string];
    if (!ok) return false;
  }
  return true;
}

/** A rule target's input settings, as in `AWS::Events::Rule` `Targets`. */
export interface TargetInput {
  readonly Input?: string;
  readonly InputPath?: string;
  readonly InputTransformer?: { InputPathsMap?: Record<string, string>; InputTemplate: string };
}

/** What the target receives for `event`. */
export function targetInput(target: TargetInput, event: Record<string, unknown>): unknown {
  if (target.Input !== undefined) {
    return JSON.parse(target.Input);
  }
  if (target.InputPath !== undefined) {
    return jsonPath(event, target.InputPath);
  }
  if (target.InputTransformer) {
    const { InputPathsMap = {}, InputTemplate } = target.InputTransformer;
    const rendered = InputTemplate.replace(/<([A-Za-z0-9_.-]+)>/g, (whole, name: string) => {
      const path = name === 'aws.events.event' ? '$' : InputPathsMap[name];
      if (path === undefined) return whole;
      const value = jsonPath(event, path);
      // Inside a JSON string a string value goes in as its characters; anything else as JSON.
      return typeof value === 'string' ? JSON.stringify(value).slice(1, -1) : JSON.stringify(value ?? null);
    });
    try {
      return JSON.parse(rendered);
    } catch {
      return rendered;
    }
  }
  return event;
}

/** The simple JSONPath EventBridge accepts: `$`, `$.a.b`, `$.a[0]`. */
export function jsonPath(value: unknown, path: string): unknown {
  if (path === '$') return value;
  if (!path.startsWith('$.')) {
    throw new Error(`unsupported JSONPath ${path}`);
  }
  let current: any = value;
  for (const part of path.slice(2).split('.')) {
    const m = /^([^[\]]+)((?:\[\d+\])*)$/.exec(part);
    if (!m) throw new Error(`unsupported JSONPath ${path}`);
    current = current?.[m[1]];
    for (const idx of m[2].match(/\d+/g) ?? []) {
      current = current?.[Number(idx)];
    }
  }
  return current;
}
