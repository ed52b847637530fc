// The official SDKs against a running `kiln serve`, unchanged: OpenAI's `responses.create` (plain and streamed) and
// Anthropic's `messages.create`, `messages.stream` and `messages.countTokens`, and errors surfacing as each SDK's
// error classes. Usage: node sdk_check.mjs BASE_URL API_KEY (KILN_NPM_DIR holds node_modules with `openai` and
// `@anthropic-ai/sdk`). Prints one line per check; exit code 1 on the first failure.
import { createRequire } from 'node:module';
import path from 'node:path';

const [baseURL, apiKey] = process.argv.slice(2);
const require = createRequire(path.resolve(process.env.KILN_NPM_DIR || process.cwd(), 'node_modules', 'x.js'));
const OpenAI = require('openai').default ?? require('openai');
const Anthropic = require('@anthropic-ai/sdk').default ?? require('@anthropic-ai/sdk');

function check(cond, what, detail) {
  if (!cond) {
    console.log(`FAIL ${what}${detail !== undefined ? ': ' + JSON.stringify(detail) : ''}`);
    process.exit(1);
  }
  console.log(`ok ${what}`);
}

// ---- OpenAI responses ----
const openai = new OpenAI({ baseURL: baseURL + '/v1', apiKey, maxRetries: 0, timeout: 60000 });
const req = { model: 'gpt-any', instructions: 'You are terse.', input: 'Say something.', max_output_tokens: 10,
  temperature: 0, ignore_eos: true };
const resp = await openai.responses.create(req);
check(resp.object === 'response' && resp.model === 'gpt-any', 'responses.create: object, model', resp.object);
check(typeof resp.output_text === 'string' && resp.output_text.length > 0, 'responses.create: output_text', resp.output_text);
check(resp.usage && resp.usage.output_tokens === 10, 'responses.create: usage', resp.usage);
check(resp.status === 'incomplete' && resp.incomplete_details.reason === 'max_output_tokens', 'responses.create: incomplete', resp.status);

let text = '';
const types = [];
let final = null;
for await (const ev of await openai.responses.create({ ...req, stream: true })) {
  types.push(ev.type);
  if (ev.type === 'response.output_text.delta') text += ev.delta;
  if (ev.type === 'response.incomplete' || ev.type === 'response.completed') final = ev.response;
}
check(types[0] === 'response.created' && types[1] === 'response.in_progress', 'responses stream: opening events', types.slice(0, 2));
check(text === resp.output_text, 'responses stream: same text', { text, want: resp.output_text });
check(final && final.usage.output_tokens === 10, 'responses stream: final response', final && final.usage);

const helper = openai.responses.stream(req);
const helperText = [];
helper.on('response.output_text.delta', (ev) => helperText.push(ev.delta));
const done = await helper.finalResponse();
check(done.output_text === resp.output_text && helperText.join('') === resp.output_text,
  'responses.stream: finalResponse and delta events', done.output_text);

try {
  await openai.responses.create({ ...req, store: true });
  check(false, 'store: true is refused');
} catch (e) {
  check(e instanceof OpenAI.BadRequestError && e.param === 'store', 'responses: BadRequestError naming store', e.error);
}

// ---- Anthropic messages ----
const anthropic = new Anthropic({ baseURL, apiKey, maxRetries: 0, timeout: 60000 });
const mreq = { model: 'claude-any', max_tokens: 10, system: 'You are terse.', temperature: 0, ignore_eos: true,
  messages: [{ role: 'user', content: 'Say something.' }] };
const msg = await anthropic.messages.create(mreq);
check(msg.type === 'message' && msg.role === 'assistant' && msg.model === 'claude-any', 'messages.create: shape', msg.type);
check(msg.content.length === 1 && msg.content[0].type === 'text', 'messages.create: one text block', msg.content);
check(msg.stop_reason === 'max_tokens' && msg.usage.output_tokens === 10, 'messages.create: stop_reason, usage', msg.usage);

const stream = anthropic.messages.stream(mreq);
let streamed = '';
stream.on('text', (t) => { streamed += t; });
const fm = await stream.finalMessage();
check(streamed === msg.content[0].text, 'messages.stream: text events', { streamed, want: msg.content[0].text });
check(fm.content[0].text === msg.content[0].text && fm.stop_reason === 'max_tokens', 'messages.stream: finalMessage', fm);
check(fm.usage.output_tokens === 10, 'messages.stream: usage', fm.usage);

let rawText = '';
for await (const ev of await anthropic.messages.create({ ...mreq, stream: true }))
  if (ev.type === 'content_block_delta' && ev.delta.type === 'text_delta') rawText += ev.delta.text;
check(rawText === msg.content[0].text, 'messages.create stream: same text', rawText);

const count = await anthropic.messages.countTokens({ model: 'claude-any', system: mreq.system, messages: mreq.messages });
check(count.input_tokens === msg.usage.input_tokens + (msg.usage.cache_read_input_tokens ?? 0), 'messages.countTokens', count);

try {
  await anthropic.messages.create({ ...mreq, max_tokens: 'ten' });
  check(false, 'a bad max_tokens is refused');
} catch (e) {
  check(e instanceof Anthropic.BadRequestError && e.status === 400, 'messages: BadRequestError', e.status);
  check(e.error && e.error.error && e.error.error.message.includes('max_tokens'), 'messages: the message names the field', e.error);
}
try {
  await new Anthropic({ baseURL, apiKey: 'wrong', maxRetries: 0 }).messages.create(mreq);
  check(false, 'a wrong key is refused');
} catch (e) {
  check(e instanceof Anthropic.AuthenticationError, 'messages: AuthenticationError (401)', e.status);
}
console.log('all sdk checks passed');
