// check.mjs drives the official Anthropic TypeScript SDK against the
// TalkIDE gateway-proxy, set up as docs/direct-sdk.md says (the gateway as
// base URL, the WorkerToken in X-Worker-Token, the SDK's default retries),
// and prints what it saw as one JSON object for sdk_ts_test.go to judge.
//
//   GATEWAY_BASE_URL=http://127.0.0.1:PORT/api/internal/gateway/anthropic/ \
//   WORKER_TOKEN=... node check.mjs <scenario>
//
// Scenarios: message, stream, count_tokens, refusal (expects the call to
// fail and reports the SDK's error), remint (WORKER_TOKEN is a
// comma-separated list the stand-in mint hands out in turn, the first one
// expired: the documented workerTokenFetch must re-mint and resend).
import Anthropic, { APIError, AuthenticationError, RateLimitError } from '@anthropic-ai/sdk';

// workerTokenFetch is docs/direct-sdk.md's TypeScript example: a fetch for
// the SDK that sets X-Worker-Token from mint() and, when the gateway answers
// 401 worker_token_expired, mints again and sends the request once more.
function workerTokenFetch(mint, next = fetch) {
  let token = null;
  return async (url, init = {}) => {
    token ??= await mint();
    const send = (tok) => {
      const headers = new Headers(init.headers);
      headers.set('X-Worker-Token', tok);
      return next(url, { ...init, headers });
    };
    let resp = await send(token);
    if (resp.status === 401) {
      const body = await resp.clone().json().catch(() => null);
      if (body?.error?.details?.error_code === 'worker_token_expired') {
        token = await mint();
        resp = await send(token);
      }
    }
    return resp;
  };
}

const scenario = process.argv[2];
let requests = 0;
const counted = (url, init) => { requests++; return fetch(url, init); };
const tokens = (process.env.WORKER_TOKEN ?? '').split(',');
const client = new Anthropic({
  baseURL: process.env.GATEWAY_BASE_URL,
  apiKey: 'unused', // the gateway drops it and adds its own
  ...(scenario === 'remint'
    ? { fetch: workerTokenFetch(async () => tokens.shift(), counted) }
    : { defaultHeaders: { 'X-Worker-Token': tokens[0] }, fetch: counted }),
});
const params = { model: 'claude-sonnet-4-5', max_tokens: 1024, messages: [{ role: 'user', content: 'hello' }] };

const out = { scenario };
try {
  switch (scenario) {
    case 'message': {
      const msg = await client.messages.create(params);
      out.text = msg.content.map((b) => b.text ?? '').join('');
      break;
    }
    case 'stream': {
      const stream = client.messages.stream(params);
      let events = 0;
      stream.on('streamEvent', () => { events++; });
      const msg = await stream.finalMessage();
      Object.assign(out, { events, text: msg.content.map((b) => b.text ?? '').join(''), stop_reason: msg.stop_reason, output_tokens: msg.usage.output_tokens });
      break;
    }
    case 'count_tokens': {
      const n = await client.messages.countTokens({ model: params.model, messages: params.messages });
      out.input_tokens = n.input_tokens;
      break;
    }
    case 'remint':
    case 'refusal': {
      await client.messages.create(params);
      out.text = 'the call succeeded';
      break;
    }
    default:
      throw new Error(`unknown scenario ${scenario}`);
  }
} catch (e) {
  if (!(e instanceof APIError)) throw e;
  out.error = {
    class: e instanceof RateLimitError ? 'RateLimitError' : e instanceof AuthenticationError ? 'AuthenticationError' : e.constructor.name,
    status: e.status,
    type: e.type ?? e.error?.error?.type ?? null,
    message: e.error?.error?.message ?? null,
    error_code: e.error?.error?.details?.error_code ?? null,
    request_id: e.requestID ?? null,
    body_request_id: e.error?.request_id ?? null,
    should_retry: e.headers?.get('x-should-retry') ?? null,
    retry_after: e.headers?.get('retry-after') ?? null,
  };
}
out.requests = requests;
console.log(JSON.stringify(out));
