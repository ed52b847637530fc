// The official OpenAI client library (npm `openai`) against a running `kiln serve`, unchanged: models, chat
// (non-streaming and streaming, with usage), legacy completions, embeddings (the client's default base64 and
// float, dimensions), and errors surfacing as the SDK's APIError with status and param. Usage: node openai_check.mjs BASE_URL API_KEY MODEL  (NODE_PATH or a node_modules next to it
// must hold `openai`). Prints one line per check; exit code 1 on the first failure.
import { createRequire } from 'node:module';
import path from 'node:path';

const [baseURL, apiKey, model] = process.argv.slice(2);
const require = createRequire(path.resolve(process.env.KILN_NPM_DIR || process.cwd(), 'node_modules', 'x.js'));
const OpenAI = require('openai').default ?? require('openai');

function check(cond, what, detail) {
  if (!cond) {
    console.log(`FAIL ${what}${detail !== undefined ? ': ' + JSON.stringify(detail) : ''}`);
    process.exit(1);
  }
  console.log(`ok ${what}`);
}

const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 60000 });

const models = await client.models.list();
const ids = [];
for await (const m of models) ids.push(m.id);
check(ids.includes(model), 'models.list lists the model', ids);

const messages = [{ role: 'system', content: 'You are terse.' }, { role: 'user', content: 'Say something.' }];
const chat = await client.chat.completions.create({ model, messages, max_tokens: 12, temperature: 0, ignore_eos: true });
check(chat.object === 'chat.completion', 'chat: object', chat.object);
check(typeof chat.choices[0].message.content === 'string', 'chat: message content');
check(chat.choices[0].message.role === 'assistant', 'chat: role');
check(['stop', 'length'].includes(chat.choices[0].finish_reason), 'chat: finish_reason', chat.choices[0].finish_reason);
check(chat.usage && chat.usage.completion_tokens === 12, 'chat: usage', chat.usage);

const stream = await client.chat.completions.create({
  model, messages, max_tokens: 12, temperature: 0, ignore_eos: true, stream: true,
  stream_options: { include_usage: true },
});
let text = '';
let finish = null;
let usage = null;
for await (const chunk of stream) {
  if (chunk.usage) usage = chunk.usage;
  for (const c of chunk.choices) {
    if (c.delta && typeof c.delta.content === 'string') text += c.delta.content;
    if (c.finish_reason) finish = c.finish_reason;
  }
}
check(text === chat.choices[0].message.content, 'chat stream: same text as non-streaming', { text, want: chat.choices[0].message.content });
check(finish === chat.choices[0].finish_reason, 'chat stream: finish_reason', finish);
check(usage && usage.completion_tokens === 12, 'chat stream: include_usage', usage);

const cmpl = await client.completions.create({ model, prompt: 'Once upon a time', max_tokens: 8, temperature: 0 });
check(cmpl.object === 'text_completion' && typeof cmpl.choices[0].text === 'string', 'completions: text');
let ctext = '';
for await (const chunk of await client.completions.create({ model, prompt: 'Once upon a time', max_tokens: 8, temperature: 0, stream: true }))
  for (const c of chunk.choices) ctext += c.text ?? '';
check(ctext === cmpl.choices[0].text, 'completions stream: same text', { ctext, want: cmpl.choices[0].text });

try {
  await client.chat.completions.create({ model, messages, temperature: -1 });
  check(false, 'bad temperature is refused');
} catch (e) {
  check(e instanceof OpenAI.APIError && e.status === 400, 'bad temperature: APIError 400', e.status);
  check(e.param === 'temperature' || (e.error && e.error.param === 'temperature'), 'bad temperature: param named', e.error);
}
// One model served: any name is accepted (as llama-server does; kiln serve --strict-model refuses others with 404).
const other = await client.chat.completions.create({ model: 'gpt-4o', messages, max_tokens: 2 });
check(other.model === 'gpt-4o', 'another model name is accepted and echoed', other.model);
try {
  await new OpenAI({ baseURL, apiKey: 'wrong', maxRetries: 0 }).models.list();
  check(false, 'a wrong API key is refused');
} catch (e) {
  check(e instanceof OpenAI.AuthenticationError, 'wrong key: AuthenticationError (401)', e.status);
}
// Embeddings (the server runs with --pooling mean): the client asks for base64 by default and decodes it.
const emb = await client.embeddings.create({ model, input: ['Once upon a time', 'The end'] });
check(emb.object === 'list' && emb.data.length === 2 && emb.data[1].index === 1, 'embeddings: list of two', emb.data.length);
const v0 = emb.data[0].embedding;
check(Array.isArray(v0) && v0.length === 256, 'embeddings: decoded vector of n_embd floats', v0 && v0.length);
const norm = Math.sqrt(v0.reduce((s, x) => s + x * x, 0));
check(Math.abs(norm - 1) < 1e-5, 'embeddings: L2-normalized', norm);
check(emb.usage.prompt_tokens > 0 && emb.usage.total_tokens === emb.usage.prompt_tokens, 'embeddings: usage', emb.usage);
const embf = await client.embeddings.create({ model, input: 'Once upon a time', encoding_format: 'float' });
check(embf.data[0].embedding.every((x, i) => Math.abs(x - v0[i]) < 1e-7), 'embeddings: float equals base64', embf.data[0].embedding.slice(0, 3));
const emb8 = await client.embeddings.create({ model, input: 'Once upon a time', dimensions: 8, encoding_format: 'float' });
const n8 = Math.sqrt(v0.slice(0, 8).reduce((s, x) => s + x * x, 0));
check(emb8.data[0].embedding.length === 8 && emb8.data[0].embedding.every((x, i) => Math.abs(x - v0[i] / n8) < 1e-6),
  'embeddings: dimensions truncates and renormalizes', emb8.data[0].embedding);
try {
  await client.embeddings.create({ model, input: 'x', dimensions: 4096 });
  check(false, 'dimensions above n_embd is refused');
} catch (e) {
  check(e instanceof OpenAI.BadRequestError && (e.param === 'dimensions' || e.error?.param === 'dimensions'),
    'embeddings: BadRequestError naming dimensions', e.error);
}
console.log('all openai client checks passed');
