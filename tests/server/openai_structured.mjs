// Structured outputs through the official OpenAI client (npm `openai`) against `kiln serve` with a random-weight
// model, whose text follows only the grammar: zodResponseFormat with chat.completions.parse() (zod parses the
// reply), a plain json_schema response_format, both streamed (chat.completions.stream), a GBNF request
// (llama-server's `grammar`, an extra body field), vLLM's guided_choice, and refusals as the SDK's APIError 400
// with the param. Every JSON output also validates with ajv (+ ajv-formats).
// Usage: node openai_structured.mjs BASE_URL API_KEY MODEL  ($KILN_NPM_DIR/node_modules holds openai, zod, ajv and
// ajv-formats). Prints one line per check; exit code 1 on the first failure.
import { createRequire } from 'node:module';
import path from 'node:path';

const [baseURL, apiKey, model] = process.argv.slice(2);
const require = createRequire(path.resolve(process.env.KILN_NPM_DIR || process.cwd(), 'node_modules', 'x.js'));
const OpenAI = require('openai').default ?? require('openai');
const { zodResponseFormat } = require('openai/helpers/zod');
const { z } = require('zod');
const Ajv = require('ajv').default;  // draft-07: what zodResponseFormat's "$schema" names
const addFormats = require('ajv-formats').default;

function check(cond, what, detail) {
  if (!cond) {
    console.log(`FAIL ${what}${detail !== undefined ? ': ' + JSON.stringify(detail) : ''}`);
    process.exit(1);
  }
  console.log(`ok ${what}`);
}

function validator(schema) {
  const ajv = new Ajv({ strict: false, allErrors: true });
  addFormats(ajv);
  const v = ajv.compile(schema);
  return (value) => (v(value) ? null : ajv.errorsText(v.errors));
}

const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 60000 });
const messages = [{ role: 'user', content: 'Describe a person as JSON.' }];

// Bounded everywhere: random weights never choose to stop early.
const Person = z.object({
  name: z.string().max(12),
  age: z.number().int().min(0).max(120),
  role: z.enum(['admin', 'user', 'guest']),
  tags: z.array(z.enum(['a', 'b', 'c'])).max(3),
  active: z.boolean(),
  nickname: z.string().max(8).nullable(),
});
const personFormat = zodResponseFormat(Person, 'person');
const personValid = validator(personFormat.json_schema.schema);

for (const seed of [1, 2, 3]) {
  const r = await client.chat.completions.parse({
    model, messages, response_format: personFormat, temperature: 1, seed, max_tokens: 1500,
  });
  const m = r.choices[0].message;
  check(r.choices[0].finish_reason === 'stop', `zod parse seed ${seed}: finish_reason stop`, r.choices[0]);
  check(m.parsed && typeof m.parsed === 'object', `zod parse seed ${seed}: parsed by zod`, m.content);
  const err = personValid(JSON.parse(m.content));
  check(err === null, `zod parse seed ${seed}: ajv validates`, { err, content: m.content });
}

// A plain json_schema response_format (no zod): .parse() gives the JSON value.
const eventSchema = {
  type: 'object',
  properties: {
    title: { type: 'string', maxLength: 16 },
    date: { type: 'string', format: 'date' },
    attendees: { type: 'array', items: { type: 'integer', minimum: 1, maximum: 999 }, minItems: 1, maxItems: 3 },
  },
  required: ['title', 'date', 'attendees'],
  additionalProperties: false,
};
const eventFormat = { type: 'json_schema', json_schema: { name: 'event', strict: true, schema: eventSchema } };
const eventValid = validator(eventSchema);
const plain = await client.chat.completions.parse({ model, messages, response_format: eventFormat, temperature: 0.8 });
check(plain.choices[0].message.parsed !== null, 'json_schema parse: parsed', plain.choices[0].message.content);
check(eventValid(plain.choices[0].message.parsed) === null, 'json_schema parse: ajv validates',
      eventValid(plain.choices[0].message.parsed));

// Streamed: the deltas add up to the final message, which zod parses.
for (const [name, format, valid] of [['zod', personFormat, personValid], ['json_schema', eventFormat, eventValid]]) {
  const stream = client.chat.completions.stream({ model, messages, response_format: format, temperature: 1, seed: 9 });
  let text = '';
  stream.on('content.delta', ({ delta }) => { text += delta; });
  const final = await stream.finalChatCompletion();
  const m = final.choices[0].message;
  check(m.content === text, `${name} stream: deltas add up to the message`, { text, content: m.content });
  check(m.parsed !== null && valid(m.parsed) === null, `${name} stream: parsed and valid`, m.content);
}

// GBNF and guided_choice: extra body fields, passed through by the client.
const gbnf = 'root ::= "(" word ("," word){0,3} ")"\nword ::= [a-z]{1,5}';
for (const seed of [1, 2]) {
  const r = await client.chat.completions.create({ model, messages, grammar: gbnf, temperature: 1, seed });
  const text = r.choices[0].message.content;
  check(/^\([a-z]{1,5}(,[a-z]{1,5}){0,3}\)$/.test(text), `grammar seed ${seed}: output matches`, text);
}
const choices = ['red', 'green', 'blue'];
const c = await client.completions.create({ model, prompt: 'Color:', guided_choice: choices, n: 4, temperature: 1 });
check(c.choices.every((x) => choices.includes(x.text)), 'guided_choice: every choice is one of them',
      c.choices.map((x) => x.text));

// Refusals: a keyword that cannot be enforced, and two constraints.
try {
  const bad = { ...eventSchema, properties: { ...eventSchema.properties, n: { type: 'integer', multipleOf: 3 } } };
  await client.chat.completions.create({
    model, messages, response_format: { type: 'json_schema', json_schema: { name: 'bad', schema: bad } },
  });
  check(false, 'multipleOf is refused');
} catch (e) {
  check(e instanceof OpenAI.BadRequestError, 'multipleOf: BadRequestError (400)', e.status);
  check(e.param === 'response_format.json_schema.schema', 'multipleOf: param named', e.param);
  check(/multipleOf/.test(e.message), 'multipleOf: the keyword named', e.message);
}
try {
  await client.chat.completions.create({ model, messages, response_format: personFormat, grammar: gbnf });
  check(false, 'two constraints are refused');
} catch (e) {
  check(e instanceof OpenAI.BadRequestError && /'response_format' and 'grammar'/.test(e.message),
        'two constraints: 400 naming both', e.message);
}
console.log('all structured output checks passed');
