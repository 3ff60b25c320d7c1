// llm-server as the official OpenAI Node SDK sees it: the real server binary, the real SDK, the
// tiny stories260K model. Run through run.sh (which installs the SDK); needs LLM_SERVER_BIN, and takes
// the models from LLM_TEST_MODELS or <repo>/../shared/models.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { fileURLToPath } from 'node:url';

import OpenAI from 'openai';

const repo = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..');
const models_dir = process.env.LLM_TEST_MODELS || path.join(repo, '..', 'shared', 'models');
const model_path = path.join(models_dir, 'stories260K');
const server_bin = process.env.LLM_SERVER_BIN;
const model = 'stories260K';  // the served name: the model directory's name
const story = [{ role: 'user', content: 'Once upon a time' }];

assert.ok(server_bin && existsSync(server_bin), `set LLM_SERVER_BIN to the llm-server binary (got '${server_bin}')`);
assert.ok(existsSync(model_path), `test model not found at ${model_path} (set LLM_TEST_MODELS)`);

// Starts llm-server on a free port and resolves once /health reports the model ready.
async function start_server(extra_args = []) {
  const env = { ...process.env };
  delete env.LLM_API_KEY;  // a key in the caller's environment would lock these tests out
  const child = spawn(server_bin,
      ['--model', model_path, '--host', '127.0.0.1', '--port', '0', '--threads', '1', ...extra_args],
      { env, stdio: ['ignore', 'ignore', 'pipe'] });
  let log = '';
  const exited = new Promise((resolve) => child.on('exit', (code, signal) => resolve({ code, signal })));
  child.stderr.setEncoding('utf8');

  const base_url = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`no 'listening on' line within 30 s:\n${log}`)), 30_000);
    child.stderr.on('data', (text) => {
      log += text;
      const m = /listening on (http:\/\/\S+:\d+)/.exec(log);
      if (m) {
        clearTimeout(timer);
        resolve(m[1]);
      }
    });
    exited.then(({ code, signal }) => {
      clearTimeout(timer);
      reject(new Error(`llm-server exited (${code ?? signal}) before listening:\n${log}`));
    });
  });

  // The socket listens before the model is loaded: /health answers 503 until then.
  for (const deadline = Date.now() + 60_000; ;) {
    const status = await fetch(`${base_url}/health`).then((r) => r.status, () => 0);
    if (status === 200) break;
    if (Date.now() > deadline) throw new Error(`/health not 200 within 60 s (last: ${status}):\n${log}`);
    await sleep(50);
  }

  let stopped = null;
  return {
    base_url,
    log: () => log,
    // SIGTERM: the server drains and exits 0.
    stop() {
      stopped ??= (child.kill('SIGTERM'), exited);
      return stopped;
    },
  };
}

function sdk(server, api_key = 'none') {
  // No retries: a failure must show up as itself, not as a slow test.
  return new OpenAI({ baseURL: `${server.base_url}/v1`, apiKey: api_key, maxRetries: 0, timeout: 60_000 });
}

// Expects `promise` to reject with the SDK's `error_class` (an APIError) carrying `status` and `fields`.
async function rejects_with(promise, error_class, status, fields = {}) {
  await assert.rejects(promise, (err) => {
    assert.ok(err instanceof OpenAI.APIError, `expected an APIError, got ${err}`);
    assert.ok(err instanceof error_class, `expected ${error_class.name}, got ${err.constructor.name}: ${err.message}`);
    assert.equal(err.status, status);
    for (const [key, value] of Object.entries(fields)) assert.equal(err[key], value, `error.${key}`);
    assert.ok(typeof err.error?.message === 'string' && err.error.message.length > 0, 'error.message');
    return true;
  });
}

describe('llm-server through the OpenAI SDK', { timeout: 120_000 }, () => {
  let server;
  let client;
  let streamed_text;

  before(async () => {
    server = await start_server();
    client = sdk(server);
  });
  after(() => server?.stop());

  test('streams a chat completion chunk by chunk', async () => {
    const stream = await client.chat.completions.create({
      model, messages: story, stream: true, max_tokens: 32, temperature: 0,
      stream_options: { include_usage: true },
    });
    const chunks = [];
    for await (const chunk of stream) chunks.push(chunk);

    assert.ok(chunks.length >= 3, `only ${chunks.length} chunks`);
    assert.equal(new Set(chunks.map((c) => c.id)).size, 1, 'one id for all chunks');
    assert.equal(new Set(chunks.map((c) => c.created)).size, 1, 'one created for all chunks');
    for (const c of chunks) {
      assert.equal(c.object, 'chat.completion.chunk');
      assert.equal(c.model, model);
    }
    assert.equal(chunks[0].choices[0].delta.role, 'assistant');

    const choices = chunks.flatMap((c) => c.choices);
    streamed_text = choices.map((ch) => ch.delta?.content ?? '').join('');
    assert.ok(streamed_text.length > 0, 'no text streamed');
    const finish_reasons = choices.map((ch) => ch.finish_reason).filter((r) => r != null);
    assert.equal(finish_reasons.length, 1, 'exactly one finish_reason');
    assert.ok(['stop', 'length'].includes(finish_reasons[0]), finish_reasons[0]);

    // include_usage: a last chunk with no choices carries the usage; every other chunk has usage null.
    const last = chunks.at(-1);
    assert.deepEqual(last.choices, []);
    assert.ok(last.usage.prompt_tokens > 0 && last.usage.completion_tokens > 0);
    assert.equal(last.usage.total_tokens, last.usage.prompt_tokens + last.usage.completion_tokens);
    for (const c of chunks.slice(0, -1)) assert.equal(c.usage, null);
  });

  test('reads a non-streamed chat completion (temperature 0)', async () => {
    const request = { model, messages: story, max_tokens: 32, temperature: 0 };
    const r = await client.chat.completions.create(request);
    assert.equal(r.object, 'chat.completion');
    assert.equal(r.model, model);
    assert.equal(r.choices.length, 1);
    const [choice] = r.choices;
    assert.equal(choice.message.role, 'assistant');
    assert.ok(typeof choice.message.content === 'string' && choice.message.content.length > 0);
    assert.ok(['stop', 'length'].includes(choice.finish_reason), choice.finish_reason);
    const { prompt_tokens, completion_tokens, total_tokens } = r.usage;
    assert.ok(prompt_tokens > 0, 'prompt_tokens');
    assert.ok(completion_tokens > 0 && completion_tokens <= 32, `completion_tokens ${completion_tokens}`);
    if (choice.finish_reason === 'length') assert.equal(completion_tokens, 32);
    assert.equal(total_tokens, prompt_tokens + completion_tokens);

    // Greedy decoding is deterministic, and streaming must not change what is generated.
    const again = await client.chat.completions.create(request);
    assert.equal(again.choices[0].message.content, choice.message.content);
    if (streamed_text !== undefined) assert.equal(choice.message.content, streamed_text);
  });

  test('completes a prompt, streamed and not', async () => {
    const request = { model, prompt: 'Once upon a time', max_tokens: 20, temperature: 0 };
    const r = await client.completions.create(request);
    assert.equal(r.object, 'text_completion');
    assert.equal(r.choices.length, 1);
    // stories260K's greedy continuation (the same as llm-generate's, see tests/CMakeLists.txt).
    assert.match(r.choices[0].text, /^, there was a little girl named Lily/);
    assert.ok(['stop', 'length'].includes(r.choices[0].finish_reason));
    assert.ok(r.usage.completion_tokens > 0);

    const stream = await client.completions.create({ ...request, stream: true });
    let text = '';
    for await (const chunk of stream) {
      assert.equal(chunk.object, 'text_completion');
      text += chunk.choices[0]?.text ?? '';
    }
    assert.equal(text, r.choices[0].text);
  });

  test('lists the model', async () => {
    const page = await client.models.list();
    const entry = page.data.find((m) => m.id === model);
    assert.ok(entry, `${model} not in ${JSON.stringify(page.data)}`);
    assert.equal(entry.object, 'model');
    assert.equal(entry.owned_by, 'llm-server');
  });

  test('errors surface as the SDK\'s APIError with their status', async () => {
    await rejects_with(client.chat.completions.create({ model, messages: story, n: 2 }),
        OpenAI.BadRequestError, 400, { type: 'invalid_request_error' });
    // A stream that can't start fails the create() call, before any chunk.
    await rejects_with(client.chat.completions.create({ model, messages: story, n: 2, stream: true }),
        OpenAI.BadRequestError, 400, { type: 'invalid_request_error' });
    await rejects_with(client.chat.completions.create({ model: 'no-such-model', messages: story }),
        OpenAI.NotFoundError, 404, { code: 'model_not_found' });
    await rejects_with(client.completions.create({ model, prompt: 'x', temperature: 'hot' }),
        OpenAI.BadRequestError, 400, { type: 'invalid_request_error' });
  });

  test('a client that walks away mid-stream does not disturb the server', async () => {
    const stream = await client.chat.completions.create({
      model, messages: story, stream: true, max_tokens: 400, temperature: 0,
    });
    for await (const chunk of stream) {
      if (chunk.choices[0]?.delta?.content) break;  // leaving the loop aborts the request
    }
    const r = await client.chat.completions.create({ model, messages: story, max_tokens: 8, temperature: 0 });
    assert.ok(r.choices[0].message.content.length > 0);
    // The abandoned sequence is cancelled (or finished): nothing stays running.
    let running;
    for (const deadline = Date.now() + 10_000; Date.now() < deadline; await sleep(50)) {
      const metrics = await (await fetch(`${server.base_url}/metrics`)).text();
      running = /^llm_requests_running\s+(\S+)/m.exec(metrics)?.[1];
      if (running === '0') break;
    }
    assert.equal(running, '0', 'llm_requests_running');
  });

  test('SIGTERM stops the server with exit status 0', async () => {
    const { code, signal } = await server.stop();
    assert.equal(signal, null, `killed by ${signal}:\n${server.log()}`);
    assert.equal(code, 0, `exit status ${code}:\n${server.log()}`);
  });
});

describe('llm-server with an API key', { timeout: 60_000 }, () => {
  let server;
  before(async () => {
    server = await start_server(['--api-key', 'test-key']);
  });
  after(() => server?.stop());

  test('the right key is accepted, a wrong one is a 401 AuthenticationError', async () => {
    const page = await sdk(server, 'test-key').models.list();
    assert.ok(page.data.some((m) => m.id === model));
    const r = await sdk(server, 'test-key').chat.completions.create({ model, messages: story, max_tokens: 4 });
    assert.ok(r.choices[0].message.content.length > 0);

    await rejects_with(sdk(server, 'wrong-key').models.list(), OpenAI.AuthenticationError, 401,
        { type: 'authentication_error' });
    await rejects_with(sdk(server, 'wrong-key').chat.completions.create({ model, messages: story }),
        OpenAI.AuthenticationError, 401);
    // Health checks come from load balancers, which hold no key.
    assert.equal((await fetch(`${server.base_url}/health`)).status, 200);
  });

  test('SIGTERM stops the server with exit status 0', async () => {
    const { code, signal } = await server.stop();
    assert.equal(signal, null, `killed by ${signal}:\n${server.log()}`);
    assert.equal(code, 0, `exit status ${code}:\n${server.log()}`);
  });
});
