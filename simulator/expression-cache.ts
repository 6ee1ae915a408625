/*
 * dynalite parses every request's expressions with PEG parsers: in a run of hundreds of executions
 * that is about a quarter of the simulator's CPU time (a profile of 400 executions at limit 10: 17% of
 * the process, all of it `validateExpressions`), time the simulated clock does not wait for. A state
 * machine sends the same few expressions again and again; only the names and values beside them change
 * (a holder's id is an attribute name, a time a value). So each expression is parsed once per shape:
 * with its names replaced by placeholders and its values by copies, and every later request of that
 * shape gets the parse with its own names and values put in.
 *
 * A request has the shape of an earlier one when its expression is the same text, its names are the same
 * keys, with the same ones equal to each other, and its values are the same keys with the same types.
 * What dynalite's parsers check of names is whether they are defined and which paths are equal (paths
 * that overlap or conflict, operands that must differ); of values, whether they are defined and their
 * types. Two checks read a value itself (BETWEEN's bounds, `attribute_type`'s type name), and a name
 * that the expression uses and also writes as a plain attribute name makes paths equal that
 * placeholders would not: such requests, and any whose parse fails (its message names the real
 * names), are parsed as before.
 * With the check on (`checkExpressionCache`, or SIM_CHECK_EXPRESSION_CACHE=1 for a whole run) every
 * request is parsed both ways, and each difference is recorded and printed.
 */

/** A dynalite parser: `parse(expression, { context })` gives a parse or an error message, or throws a syntax error. */
interface DynaliteParser {
  parse(expression: string, options: { context: ParseContext }): unknown;
}

/** What dynalite's `validateExpressions` hands its parsers. */
interface ParseContext {
  attrNames?: Record<string, string>;
  attrVals?: Record<string, unknown>;
  unusedAttrNames?: Record<string, boolean>;
  unusedAttrVals?: Record<string, boolean>;
  [other: string]: unknown;
}

/** A parse of one shape: with placeholder names and copied values, and what it used of them. */
interface Template {
  readonly result: unknown;
  /** The copies the parse was given, by key: where the parse holds one, a request's own value goes. */
  readonly values: Map<unknown, string>;
  readonly usedNames: string[];
  readonly usedValues: string[];
}

/** Marks a placeholder name: no attribute name written in an expression can hold it. */
const MARK = '\u0001';
const PLACEHOLDER = /\u0001(\d+)\u0001/g;
/** Expressions whose checks read a value's content, not only its type. */
const READS_VALUES = /between|attribute_type/i;
const TYPES = ['S', 'N', 'B', 'NULL', 'BOOL', 'SS', 'NS', 'BS', 'L', 'M'];

/** Every parse, by parser and shape (a few hundred shapes for a library's state machines). */
const templates = new Map<string, Template | null>();
/** The most shapes kept: a caller that builds its expressions from data would otherwise fill memory. */
const MAX_TEMPLATES = 10_000;

function typeOf(value: unknown): string {
  if (value === null || typeof value !== 'object') return '?';
  return TYPES.find((t) => (value as Record<string, unknown>)[t] != null) ?? '?';
}

/** A request's shape: its key, and its names by class (equal names share one). */
interface Shape {
  readonly key: string;
  /** The request's distinct names, by class. */
  readonly classes: string[];
  /** The class of each name's key. */
  readonly classOf: Map<string, number>;
}

/** A request's shape; undefined where the request must be parsed as it is. */
function shapeOf(parserId: string, expression: string, context: ParseContext): Shape | undefined {
  if (READS_VALUES.test(expression) || expression.includes(MARK)) return undefined;
  const classes: string[] = [];
  const classOf = new Map<string, number>();
  const nameParts: string[] = [];
  const names = context.attrNames;
  if (names) {
    // The attribute names written in the expression itself (and its keywords): what is left without the placeholders.
    const written = new Set(expression.replace(/[#:][A-Za-z0-9_]+/g, ' ').match(/[A-Za-z0-9_]+/g) ?? []);
    const placed = new Set(expression.match(/#[A-Za-z0-9_]+/g) ?? []);
    for (const key of Object.keys(names).sort()) {
      const name = names[key];
      if (typeof name !== 'string' || name === '' || name.includes(MARK) || (placed.has(key) && written.has(name))) return undefined;
      let index = classes.indexOf(name);
      if (index < 0) index = classes.push(name) - 1;
      classOf.set(key, index);
      nameParts.push(`${key}=${index}`);
    }
  }
  const valueParts: string[] = [];
  const values = context.attrVals;
  if (values) for (const key of Object.keys(values).sort()) valueParts.push(`${key}=${typeOf(values[key])}`);
  const key = [parserId, expression, names ? nameParts.join(',') : '-', values ? valueParts.join(',') : '-'].join(MARK);
  return { key, classes, classOf };
}

function deepCopy<T>(value: T): T {
  return JSON.parse(JSON.stringify(value)) as T;
}

/** Parse a shape once, with placeholders for its names and copies of its values; null if that fails. */
function buildTemplate(
  parser: DynaliteParser,
  parse: DynaliteParser['parse'],
  expression: string,
  context: ParseContext,
  classOf: Map<string, number>,
): Template | null {
  const names: Record<string, string> = {};
  for (const [key, index] of classOf) names[key] = `${MARK}${index}${MARK}`;
  const values: Record<string, unknown> = {};
  const copies = new Map<unknown, string>();
  for (const [key, value] of Object.entries(context.attrVals ?? {})) {
    values[key] = deepCopy(value);
    copies.set(values[key], key);
  }
  const unusedNames: Record<string, boolean> = {};
  for (const key of Object.keys(context.attrNames ?? {})) unusedNames[key] = true;
  const unusedValues: Record<string, boolean> = {};
  for (const key of Object.keys(context.attrVals ?? {})) unusedValues[key] = true;
  const templateContext: ParseContext = {
    ...context,
    attrNames: context.attrNames ? names : undefined,
    attrVals: context.attrVals ? values : undefined,
    unusedAttrNames: unusedNames,
    unusedAttrVals: unusedValues,
  };
  let result: unknown;
  try {
    result = parse.call(parser, expression, { context: templateContext });
  } catch {
    return null;
  }
  if (typeof result === 'string') return null;
  return {
    result,
    values: copies,
    usedNames: Object.keys(context.attrNames ?? {}).filter((k) => !(k in unusedNames)),
    usedValues: Object.keys(context.attrVals ?? {}).filter((k) => !(k in unusedValues)),
  };
}

/** The template's parse with the request's names and values in it (dynalite's parse holds a request's values, not copies). */
function fill(node: unknown, classes: string[], copies: Map<unknown, string>, values: Record<string, unknown>): unknown {
  if (typeof node === 'string') return node.includes(MARK) ? node.replace(PLACEHOLDER, (_m, i: string) => classes[Number(i)]) : node;
  if (node === null || typeof node !== 'object') return node;
  const key = copies.get(node);
  if (key !== undefined) return values[key];
  if (Array.isArray(node)) return node.map((n) => fill(n, classes, copies, values));
  const out: Record<string, unknown> = Object.getPrototypeOf(node) === null ? Object.create(null) : {};
  for (const [k, v] of Object.entries(node)) out[fill(k, classes, copies, values) as string] = fill(v, classes, copies, values);
  return out;
}

function cached(parser: DynaliteParser, parserId: string, parse: DynaliteParser['parse']): DynaliteParser['parse'] {
  return function parseOnce(expression: string, options: { context: ParseContext }): unknown {
    const context = options.context;
    const shape = shapeOf(parserId, expression, context);
    if (!shape) return parse.call(parser, expression, options);
    let template = templates.get(shape.key);
    if (template === undefined) {
      template = buildTemplate(parser, parse, expression, context, shape.classOf);
      if (templates.size >= MAX_TEMPLATES) templates.clear();
      templates.set(shape.key, template);
    }
    if (template === null) return parse.call(parser, expression, options);
    const result = fill(template.result, shape.classes, template.values, context.attrVals ?? {});
    if (check.on) {
      const unusedNames = { ...context.unusedAttrNames };
      const unusedValues = { ...context.unusedAttrVals };
      let direct: unknown;
      try {
        direct = parse.call(parser, expression, { context: { ...context, unusedAttrNames: unusedNames, unusedAttrVals: unusedValues } });
      } catch (e) {
        direct = `threw ${(e as Error).message}`;
      }
      const used = (before: Record<string, boolean> | undefined, after: Record<string, boolean>) =>
        Object.keys(before ?? {})
          .filter((k) => !(k in after))
          .sort()
          .join();
      const expected = {
        parse: direct,
        usedNames: used(context.unusedAttrNames, unusedNames),
        usedValues: used(context.unusedAttrVals, unusedValues),
      };
      const got = {
        parse: result,
        usedNames: template.usedNames.filter((k) => context.unusedAttrNames?.[k]).sort().join(),
        usedValues: template.usedValues.filter((k) => context.unusedAttrVals?.[k]).sort().join(),
      };
      if (JSON.stringify(expected) !== JSON.stringify(got)) {
        const mismatch =
          `the expression cache parsed ${JSON.stringify(expression)} as ${JSON.stringify(got)}, ` + `dynalite as ${JSON.stringify(expected)}`;
        check.mismatches.push(mismatch);
        console.error(mismatch);
      }
    }
    check.served++;
    for (const key of template.usedNames) delete context.unusedAttrNames?.[key];
    for (const key of template.usedValues) delete context.unusedAttrVals?.[key];
    return result;
  };
}

/** The check's state: on or off, what it found, and how many requests the cache served. */
const check = { on: process.env.SIM_CHECK_EXPRESSION_CACHE === '1', mismatches: [] as string[], served: 0 };

/**
 * Parse every request both ways from now on (on) or not: returns the differences found so far, and how
 * many requests the cache has served in this process.
 */
export function checkExpressionCache(on: boolean): { readonly mismatches: string[]; readonly served: number } {
  check.on = on;
  return { mismatches: [...check.mismatches], served: check.served };
}

let installed = false;

/** Parse each shape of expression once in dynalite's parsers (its condition, update and projection expressions). Idempotent. */
export function installExpressionCache(): void {
  if (installed) return;
  installed = true;
  for (const id of ['conditionParser', 'updateParser', 'projectionParser']) {
    // eslint-disable-next-line @typescript-eslint/no-require-imports
    const parser = require(`dynalite/db/${id}`) as DynaliteParser;
    parser.parse = cached(parser, id, parser.parse);
  }
}
