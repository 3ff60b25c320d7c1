// llm-server through the official OpenAI Node SDK: lists the model, streams a chat completion, then
// reads a non-streamed one.
//   cd clients/examples && npm install && node openai_sdk.mjs
// LLM_URL (default http://127.0.0.1:8080) and LLM_API_KEY say which server and key to use.
import OpenAI from 'openai';

const client = new OpenAI({
  baseURL: `${process.env.LLM_URL || 'http://127.0.0.1:8080'}/v1`,
  // The SDK insists on a key; llm-server only checks it when started with --api-key.
  apiKey: process.env.LLM_API_KEY || 'none',
});

try {
  const { data: [{ id: model }] } = await client.models.list();
  const messages = [
    { role: 'system', content: 'You are a storyteller.' },
    { role: 'user', content: 'Once upon a time' },
  ];

  console.log(`--- ${model}, streamed:`);
  const stream = await client.chat.completions.create({ model, messages, max_tokens: 64, stream: true });
  for await (const chunk of stream) process.stdout.write(chunk.choices[0]?.delta?.content ?? '');

  console.log(`\n--- ${model}, not streamed, temperature 0:`);
  const completion = await client.chat.completions.create({ model, messages, max_tokens: 64, temperature: 0 });
  console.log(completion.choices[0].message.content);
  console.log('finish_reason:', completion.choices[0].finish_reason, 'usage:', completion.usage);
} catch (err) {
  // HTTP errors arrive as OpenAI.APIError subclasses with the status and the server's message.
  if (!(err instanceof OpenAI.APIError)) throw err;
  console.error(`error: ${err.status ?? 'no response'}: ${err.message}`);
  process.exitCode = 1;
}
