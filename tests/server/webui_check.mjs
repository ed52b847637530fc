// The chat page at / in headless Chromium (npm `puppeteer-core` driving Debian's chromium): it loads, asks for the
// API key the server wants, shows the model from /props, sends a message and shows the streamed reply, stops a
// reply mid-stream, and after a reload shows the conversation again (kept in the browser).
// Usage: node webui_check.mjs BASE_URL API_KEY MODEL [SCREENSHOT_DIR]  (KILN_NPM_DIR holds node_modules with
// puppeteer-core; CHROMIUM, else /usr/bin/chromium). Prints one line per check; exit code 1 on the first failure.
import { createRequire } from 'node:module';
import path from 'node:path';

const [base, apiKey, model, shots] = process.argv.slice(2);
const require = createRequire(path.resolve(process.env.KILN_NPM_DIR || process.cwd(), 'node_modules', 'x.js'));
const puppeteer = require('puppeteer-core');

let browser;
async function check(cond, what, detail) {
  if (!cond) {
    console.log(`FAIL ${what}${detail !== undefined ? ': ' + JSON.stringify(detail) : ''}`);
    if (browser) await browser.close();
    process.exit(1);
  }
  console.log(`ok ${what}`);
}

browser = await puppeteer.launch({
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
  headless: true,
  args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage'],
});
const page = await browser.newPage();
await page.setViewport({ width: 1100, height: 700 });
const errors = [];
page.on('pageerror', (e) => errors.push(String(e)));
const external = [];
page.on('request', (r) => { if (!r.url().startsWith(base)) external.push(r.url()); });

await page.goto(base + '/', { waitUntil: 'load' });
await page.waitForSelector('#keybar.open', { timeout: 10000 });
await check(true, 'the page asks for the API key');
await page.type('#key', apiKey);
await page.click('#savekey');
await page.waitForFunction((m) => document.querySelector('#model').textContent === m, { timeout: 10000 }, model);
const ctx = await page.$eval('#ctx', (e) => e.textContent);
await check(/context \d+ tokens/.test(ctx), 'model name and context from /props', ctx);

// Settings: a short reply first.
await page.click('#toggle-settings');
await page.$eval('#max_tokens', (e) => { e.value = '12'; e.dispatchEvent(new Event('change')); });
await page.$eval('#temperature', (e) => { e.value = '0'; e.dispatchEvent(new Event('change')); });
await page.type('#input', 'Tell me about the beginning.');
await page.click('#send');
await page.waitForFunction(() => document.querySelectorAll('.msg.assistant').length === 1 &&
  !document.querySelector('#send').disabled, { timeout: 30000 });
const first = await page.$eval('.msg.assistant .body', (e) => e.textContent);
await check(first.trim().length > 0, 'a streamed reply is shown', first);

// A long reply, stopped once text has arrived.
await page.$eval('#max_tokens', (e) => { e.value = '3000'; e.dispatchEvent(new Event('change')); });
await page.type('#input', 'And then?');
await page.click('#send');
await page.waitForFunction(() => {
  const a = document.querySelectorAll('.msg.assistant');
  return a.length === 2 && a[1].querySelector('.body').textContent.length > 20;
}, { timeout: 30000 });
await check(!(await page.$eval('#stop', (e) => e.disabled)), 'the stop button is live while streaming');
if (shots) await page.screenshot({ path: path.join(shots, 'webui-streaming.png') });
await page.click('#stop');
await page.waitForFunction(() => !document.querySelector('#send').disabled, { timeout: 10000 });
const stopped = await page.$eval('.msg.assistant:last-child .body', (e) => e.textContent);
await new Promise((r) => setTimeout(r, 500));
const later = await page.$eval('.msg.assistant:last-child .body', (e) => e.textContent);
await check(stopped.length > 0 && later === stopped, 'stop ends the reply and keeps what came', stopped.length);

// Reload: the conversation is still there.
await page.reload({ waitUntil: 'load' });
await page.waitForFunction(() => document.querySelectorAll('.msg').length === 4, { timeout: 10000 });
const convs = await page.$$eval('.conv', (e) => e.length);
const kept = await page.$eval('.msg.assistant .body', (e) => e.textContent);
await check(convs === 1 && kept === first, 'after a reload the history is shown', { convs, kept });
if (shots) await page.screenshot({ path: path.join(shots, 'webui.png') });

// The renderer: fenced code highlighted, reasoning collapsed, markup in replies escaped.
const md = await page.evaluate(() => markdown('# Title\n\nSome **bold** and `code`.\n\n```js\nconst x = "s"; // c\n```\n- a\n- b'));
await check(md.includes('<h1>Title</h1>') && md.includes('<strong>bold</strong>') && md.includes('<code>code</code>') &&
  md.includes('<span class="kw">const</span>') && md.includes('<span class="str">&quot;s&quot;</span>') &&
  md.includes('<span class="com">// c</span>') && md.includes('<ul><li>a</li><li>b</li></ul>'), 'markdown and code highlighting', md);
const node = await page.evaluate(() => {
  const n = messageNode({ role: 'assistant', content: '<img src=x onerror=alert(1)>', reasoning: 'thinking <b>' });
  const d = n.querySelector('details');
  return { open: d.open, reasoning: d.textContent, img: n.querySelector('img') !== null };
});
await check(node.open === false && node.reasoning.includes('thinking <b>') && !node.img, 'reasoning collapsed, markup escaped', node);

await check(errors.length === 0, 'no script errors', errors);
await check(external.length === 0, 'nothing is loaded from elsewhere', external);
await browser.close();
console.log('all webui checks passed');
