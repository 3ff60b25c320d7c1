#!/usr/bin/python3
"""Integration tests for llm-server: the real binary over real sockets.

Run: /usr/bin/python3 tests/server/test_server.py --server-bin PATH --models DIR [unittest args]

Servers started (each on 127.0.0.1 --port 0, stopped with SIGTERM expecting exit 0):
  main        stories260K, defaults (--parallel 4): completions, chat, errors, metrics, tokenizer,
              concurrency, keep-alive
  restricted  stories260K --api-key --cors-origin --max-body-bytes 1000 --ctx 64 --timeout-seconds 2
              --model-alias: auth, CORS, body limit, context limit, slow clients, alias
  slot        tiny-qwen2 --parallel 1 --max-queue 0 --ctx 16384: queue full, client disconnect.
              (tiny-qwen2's 152k-token vocabulary makes a token ~1 ms, so a 16000-token
              ignore_eos stream runs for many seconds; stories260K would finish 500 tokens in
              ~50 ms, too fast to hold a slot open reliably.)
  shutdown    tiny-qwen2 --shutdown-timeout-seconds 2: SIGTERM during a stream
"""
import argparse
import atexit
import json
import os
import select
import signal
import socket
import sys
import threading
import time
import unittest

sys.dont_write_bytecode = True  # leave no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import ServerProcess, parse_prometheus, metric_sum  # noqa: E402

ARGS = None  # set in main()

MODEL_NAME = "stories260K"
PROMPT = "Once upon a time"
# Greedy continuation of PROMPT by stories260K (llm-generate --temp 0; ctest cli_generate_stories).
GREEDY = ", there was a little girl named Lily. She loved to play outside in the park."
PROMPT_IDS_NO_BOS = [403, 407, 261, 378]  # llm-tokenize --model stories260K "Once upon a time"
BOS = 1

COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"

MAIN = None  # the module's main server


def model_dir(name):
    return os.path.join(ARGS.models, name)


def setUpModule():
    global MAIN
    unittest.addModuleCleanup(_stop_main)
    MAIN = ServerProcess(ARGS.server_bin, model_dir(MODEL_NAME), ["--parallel", "4"], name="main").start()


def _stop_main():
    if MAIN is not None:
        MAIN.stop(timeout=15)


def jdump(obj, limit=1500):
    if isinstance(obj, (bytes, bytearray)):
        obj = obj.decode("utf-8", errors="replace")
    s = json.dumps(obj) if not isinstance(obj, str) else obj
    return s if len(s) <= limit else s[:limit] + "...(%d chars)" % len(s)


class ServerTestCase(unittest.TestCase):
    maxDiff = 4000
    server = None  # set by subclasses / setUpClass

    expect_exit = False  # ShutdownTests stops its server on purpose

    def tearDown(self):
        s = self.srv
        if s is not None and s.proc is not None and not self.expect_exit and not s.alive():
            self.fail("the server process died during this test (exit code %s)\n%s" % (s.proc.returncode, s.describe()))

    @property
    def srv(self):
        return self.server if self.server is not None else MAIN

    # -- helpers -------------------------------------------------------------
    def ctx(self, what, req=None, resp=None, srv=None):
        """Failure context: the request, the response, the server log tail."""
        parts = [what]
        if req is not None:
            parts.append("request: %s" % jdump(req))
        if resp is not None:
            parts.append("response: %s" % (resp.describe() if hasattr(resp, "describe") else jdump(resp)))
        s = srv or self.srv
        if s is not None:
            parts.append("server log tail:\n%s" % s.log(tail=25))
        return "\n".join(parts)

    def post_ok(self, path, body, headers=None, srv=None):
        s = srv or self.srv
        r = s.post(path, body, headers)
        self.assertEqual(r.status, 200, self.ctx("POST %s" % path, body, r, s))
        ct = r.header("content-type") or ""
        self.assertTrue(ct.startswith("application/json"), self.ctx("Content-Type %r" % ct, body, r, s))
        return r.json()

    def tokenize(self, text, add_special, srv=None, headers=None):
        s = srv or self.srv
        body = {"content": text, "add_special": add_special}
        out = self.post_ok("/tokenize", body, headers, srv=s)
        toks = out.get("tokens")
        self.assertIsInstance(toks, list, self.ctx("/tokenize tokens", body, out, s))
        self.assertTrue(all(isinstance(t, int) for t in toks), self.ctx("/tokenize tokens not ints", body, out, s))
        return toks

    def assert_error(self, resp, status, type_=None, code=None, req=None, srv=None, param_field=None):
        s = srv or self.srv
        self.assertEqual(resp.status, status, self.ctx("expected HTTP %d" % status, req, resp, s))
        ct = resp.header("content-type") or ""
        self.assertTrue(ct.startswith("application/json"),
                        self.ctx("error Content-Type %r, expected application/json" % ct, req, resp, s))
        body = resp.json()
        self.assertIsInstance(body, dict, self.ctx("error body", req, resp, s))
        err = body.get("error")
        self.assertIsInstance(err, dict, self.ctx("error body lacks an 'error' object", req, resp, s))
        for k in ("message", "type", "param", "code"):
            self.assertIn(k, err, self.ctx("error object lacks %r" % k, req, resp, s))
        self.assertIsInstance(err["message"], str, self.ctx("error.message", req, resp, s))
        self.assertTrue(err["message"].strip(), self.ctx("error.message empty", req, resp, s))
        self.assertIsInstance(err["type"], str, self.ctx("error.type", req, resp, s))
        self.assertTrue(err["param"] is None or isinstance(err["param"], str), self.ctx("error.param", req, resp, s))
        self.assertTrue(err["code"] is None or isinstance(err["code"], (str, int)), self.ctx("error.code", req, resp, s))
        if type_ is not None:
            allowed = type_ if isinstance(type_, (tuple, list, set)) else (type_,)
            self.assertIn(err["type"], allowed, self.ctx("error.type", req, resp, s))
        if code is not None:
            self.assertEqual(err["code"], code, self.ctx("error.code", req, resp, s))
        if param_field is not None and err["param"] is not None:
            self.assertIn(param_field, err["param"], self.ctx("error.param names another field", req, resp, s))
        return err

    def assert_created(self, created, what):
        self.assertIsInstance(created, int, what)
        self.assertLess(abs(created - time.time()), 600, "%s: created %r is not the current unix time" % (what, created))

    def check_completion(self, out, req, chat):
        """Shape of a non-streamed response; returns (text, finish_reason, usage)."""
        c = lambda m: self.ctx(m, req, out)  # noqa: E731
        self.assertEqual(out.get("object"), "chat.completion" if chat else "text_completion", c("object"))
        self.assertIsInstance(out.get("id"), str, c("id"))
        self.assertTrue(out["id"], c("id empty"))
        self.assert_created(out.get("created"), c("created"))
        self.assertEqual(out.get("model"), req.get("model") or self.model_name(), c("model"))
        choices = out.get("choices")
        self.assertIsInstance(choices, list, c("choices"))
        self.assertEqual(len(choices), 1, c("choices"))
        ch = choices[0]
        self.assertEqual(ch.get("index"), 0, c("choices[0].index"))
        if chat:
            msg = ch.get("message")
            self.assertIsInstance(msg, dict, c("message"))
            self.assertEqual(msg.get("role"), "assistant", c("message.role"))
            text = msg.get("content")
        else:
            text = ch.get("text")
        self.assertIsInstance(text, str, c("text/content"))
        self.assertIn(ch.get("finish_reason"), ("stop", "length"), c("finish_reason"))
        self.assertIn("logprobs", ch, c("choices[0] lacks 'logprobs'"))
        usage = out.get("usage")
        self.assertIsInstance(usage, dict, c("usage"))
        for k in ("prompt_tokens", "completion_tokens", "total_tokens"):
            self.assertIsInstance(usage.get(k), int, c("usage.%s" % k))
        self.assertEqual(usage["total_tokens"], usage["prompt_tokens"] + usage["completion_tokens"], c("total_tokens"))
        return text, ch["finish_reason"], usage

    def model_name(self):
        return MODEL_NAME

    def check_stream(self, resp, events, req, chat, include_usage=False):
        """Checks a whole SSE exchange; returns (text, finish_reason, usage or None, chunks)."""
        c = lambda m: self.ctx(m, req, {"status": resp.status, "events": events})  # noqa: E731
        self.assertEqual(resp.status, 200, self.ctx("stream status", req, resp))
        ct = resp.header("content-type") or ""
        self.assertTrue(ct.startswith("text/event-stream"), c("Content-Type %r" % ct))
        self.assertIsNotNone(events, c("no events"))
        self.assertTrue(events, c("no events"))
        self.assertEqual(events[-1], "[DONE]", c("last data line is not [DONE]"))
        self.assertEqual(events.count("[DONE]"), 1, c("[DONE] more than once"))
        chunks = []
        for ev in events[:-1]:
            try:
                chunks.append(json.loads(ev))
            except ValueError:
                self.fail(c("event is not JSON: %r" % ev))
        for ch in chunks:
            self.assertNotIn("error", ch, c("error event in stream"))
        self.assertTrue(chunks, c("no chunks before [DONE]"))
        obj = "chat.completion.chunk" if chat else "text_completion"
        ids = {ch.get("id") for ch in chunks}
        createds = {ch.get("created") for ch in chunks}
        self.assertEqual(len(ids), 1, c("ids differ between chunks: %s" % ids))
        self.assertIsInstance(chunks[0].get("id"), str, c("id"))
        self.assertTrue(chunks[0]["id"], c("id empty"))
        self.assertEqual(len(createds), 1, c("created differs between chunks: %s" % createds))
        self.assert_created(chunks[0].get("created"), c("created"))
        for ch in chunks:
            self.assertEqual(ch.get("object"), obj, c("object"))
            self.assertEqual(ch.get("model"), req.get("model") or self.model_name(), c("model"))
        usage = None
        body_chunks = chunks
        if include_usage:
            last = chunks[-1]
            self.assertEqual(last.get("choices"), [], c("include_usage: last chunk must have choices []"))
            usage = last.get("usage")
            self.assertIsInstance(usage, dict, c("include_usage: last chunk usage"))
            for k in ("prompt_tokens", "completion_tokens", "total_tokens"):
                self.assertIsInstance(usage.get(k), int, c("usage.%s" % k))
            self.assertEqual(usage["total_tokens"], usage["prompt_tokens"] + usage["completion_tokens"], c("total"))
            body_chunks = chunks[:-1]
            for ch in body_chunks:
                self.assertIn("usage", ch, c("include_usage: every chunk must carry \"usage\": null"))
                self.assertIsNone(ch["usage"], c("include_usage: usage must be null before the last chunk"))
        else:
            for ch in chunks:
                self.assertIsNone(ch.get("usage"), c("usage without stream_options.include_usage"))
                self.assertNotEqual(ch.get("choices"), [], c("a choices [] chunk without include_usage"))
        self.assertTrue(body_chunks, c("no choice chunks"))
        pieces, finish = [], None
        for i, ch in enumerate(body_chunks):
            choices = ch.get("choices")
            self.assertIsInstance(choices, list, c("choices"))
            self.assertEqual(len(choices), 1, c("choices"))
            choice = choices[0]
            self.assertEqual(choice.get("index"), 0, c("index"))
            fr = choice.get("finish_reason")
            if i < len(body_chunks) - 1:
                self.assertIsNone(fr, c("finish_reason before the final chunk (chunk %d)" % i))
            if chat:
                delta = choice.get("delta")
                self.assertIsInstance(delta, dict, c("delta"))
                if i == 0:
                    self.assertEqual(delta.get("role"), "assistant", c("first chat chunk: delta.role"))
                    self.assertIn(delta.get("content", ""), ("", None), c("first chat chunk carries content"))
                else:
                    self.assertNotIn("role", delta, c("role in a later delta (chunk %d)" % i))
                piece = delta.get("content") or ""
            else:
                piece = choice.get("text")
                self.assertIsInstance(piece, str, c("text"))
            pieces.append(piece)
        final = body_chunks[-1]["choices"][0]
        finish = final.get("finish_reason")
        self.assertIn(finish, ("stop", "length"), c("final chunk finish_reason"))
        if chat:
            self.assertEqual(final.get("delta"), {}, c("final chat chunk: delta must be {}"))
        return "".join(pieces), finish, usage, chunks

    def stream_ok(self, path, req, include_usage=False, srv=None):
        s = srv or self.srv
        resp, events = s.stream(path, req)
        return self.check_stream(resp, events, req, chat=(path == CHAT), include_usage=include_usage)


# ---------------------------------------------------------------------------
# Text completions
# ---------------------------------------------------------------------------

class TextCompletionTests(ServerTestCase):
    def test_greedy_length_and_usage(self):
        req = {"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": 8, "temperature": 0}
        out = self.post_ok(COMPLETIONS, req)
        text, finish, usage = self.check_completion(out, req, chat=False)
        self.assertTrue(text, self.ctx("empty text", req, out))
        self.assertEqual(finish, "length", self.ctx("finish_reason with max_tokens 8", req, out))
        self.assertTrue(GREEDY.startswith(text), self.ctx("greedy text %r is not a prefix of %r" % (text, GREEDY), req, out))
        n_prompt = len(self.tokenize(PROMPT, True))
        self.assertEqual(usage["prompt_tokens"], n_prompt, self.ctx("prompt_tokens vs /tokenize add_special", req, out))
        self.assertEqual(usage["completion_tokens"], 8, self.ctx("completion_tokens with finish length", req, out))

    def test_greedy_full_sentence(self):
        req = {"prompt": PROMPT, "max_tokens": 40, "temperature": 0}
        out = self.post_ok(COMPLETIONS, req)
        text, finish, usage = self.check_completion(out, req, chat=False)
        self.assertTrue(text.startswith(GREEDY), self.ctx("greedy text", req, out))
        self.assertEqual(usage["completion_tokens"], 40, self.ctx("completion_tokens", req, out))

    def test_stop_string(self):
        req = {"prompt": PROMPT, "max_tokens": 40, "temperature": 0, "stop": " Lily"}
        out = self.post_ok(COMPLETIONS, req)
        text, finish, usage = self.check_completion(out, req, chat=False)
        self.assertEqual(finish, "stop", self.ctx("finish_reason with a stop string that occurs", req, out))
        self.assertNotIn("Lily", text, self.ctx("stop string in the output", req, out))
        self.assertEqual(text, GREEDY.split(" Lily")[0], self.ctx("text before the stop string", req, out))
        self.assertGreater(usage["completion_tokens"], 0, self.ctx("completion_tokens", req, out))
        self.assertLess(usage["completion_tokens"], 40, self.ctx("completion_tokens", req, out))

    def test_stop_array_first_match_wins(self):
        req = {"prompt": PROMPT, "max_tokens": 40, "temperature": 0, "stop": ["park", " girl", "zzz"]}
        out = self.post_ok(COMPLETIONS, req)
        text, finish, _ = self.check_completion(out, req, chat=False)
        self.assertEqual(finish, "stop", self.ctx("finish_reason", req, out))
        self.assertEqual(text, GREEDY.split(" girl")[0], self.ctx("text before the earliest stop string", req, out))

    def test_stream_equals_non_stream(self):
        req = {"prompt": PROMPT, "max_tokens": 20, "temperature": 0}
        out = self.post_ok(COMPLETIONS, req)
        ref, ref_finish, ref_usage = self.check_completion(out, req, chat=False)
        sreq = dict(req, stream=True)
        text, finish, usage, chunks = self.stream_ok(COMPLETIONS, sreq)
        self.assertEqual(text, ref, self.ctx("streamed text != non-streamed text at temperature 0", sreq, chunks))
        self.assertEqual(finish, ref_finish, self.ctx("finish_reason", sreq, chunks))
        self.assertEqual(finish, "length")

    def test_stream_include_usage(self):
        req = {"prompt": PROMPT, "max_tokens": 12, "temperature": 0}
        ref_out = self.post_ok(COMPLETIONS, req)
        ref, _, ref_usage = self.check_completion(ref_out, req, chat=False)
        sreq = dict(req, stream=True, stream_options={"include_usage": True})
        text, finish, usage, chunks = self.stream_ok(COMPLETIONS, sreq, include_usage=True)
        self.assertEqual(text, ref)
        self.assertEqual(usage, ref_usage, self.ctx("streamed usage != non-streamed usage", sreq, chunks))
        self.assertEqual(usage["completion_tokens"], 12)

    def test_stream_stop_string_never_emitted(self):
        req = {"prompt": PROMPT, "max_tokens": 40, "temperature": 0, "stop": [" Lily"], "stream": True}
        text, finish, _, chunks = self.stream_ok(COMPLETIONS, req)
        self.assertEqual(finish, "stop", self.ctx("finish_reason", req, chunks))
        self.assertEqual(text, GREEDY.split(" Lily")[0], self.ctx("streamed text before the stop string", req, chunks))
        for ch in chunks:
            piece = ch["choices"][0]["text"] if ch.get("choices") else ""
            self.assertNotIn("Lily", piece, self.ctx("a chunk carries the stop string", req, chunks))

    def test_prompt_as_token_ids(self):
        ids = self.tokenize(PROMPT, True)
        self.assertEqual(ids, [BOS] + PROMPT_IDS_NO_BOS)
        ref = self.post_ok(COMPLETIONS, {"prompt": PROMPT, "max_tokens": 15, "temperature": 0})
        req = {"prompt": ids, "max_tokens": 15, "temperature": 0}
        out = self.post_ok(COMPLETIONS, req)
        text, _, usage = self.check_completion(out, req, chat=False)
        self.assertEqual(text, ref["choices"][0]["text"], self.ctx("token-id prompt gives other text", req, out))
        self.assertEqual(usage["prompt_tokens"], len(ids), self.ctx("prompt_tokens for a token-id prompt", req, out))

    def test_prompt_as_array_of_one_string(self):
        ref = self.post_ok(COMPLETIONS, {"prompt": PROMPT, "max_tokens": 10, "temperature": 0})
        req = {"prompt": [PROMPT], "max_tokens": 10, "temperature": 0}
        out = self.post_ok(COMPLETIONS, req)
        self.assertEqual(out["choices"][0]["text"], ref["choices"][0]["text"], self.ctx("[prompt] differs", req, out))

    def test_logprobs(self):
        req = {"prompt": PROMPT, "max_tokens": 6, "temperature": 0, "logprobs": 2}
        out = self.post_ok(COMPLETIONS, req)
        text, _, usage = self.check_completion(out, req, chat=False)
        lp = out["choices"][0]["logprobs"]
        c = lambda m: self.ctx(m, req, out)  # noqa: E731
        self.assertIsInstance(lp, dict, c("choices[0].logprobs"))
        for k in ("tokens", "token_logprobs", "top_logprobs"):
            self.assertIsInstance(lp.get(k), list, c("logprobs.%s" % k))
            self.assertEqual(len(lp[k]), 6, c("logprobs.%s: one entry per generated token" % k))
        self.assertEqual("".join(lp["tokens"]), text, c("logprobs.tokens do not spell the text"))
        for tok_lp, top in zip(lp["token_logprobs"], lp["top_logprobs"]):
            self.assertIsInstance(tok_lp, (int, float), c("token_logprob"))
            self.assertLessEqual(tok_lp, 1e-6, c("a log probability > 0"))
            self.assertIsInstance(top, dict, c("top_logprobs entry"))
            self.assertTrue(1 <= len(top) <= 2, c("top_logprobs entry must have up to 2 alternatives"))
            # greedy: the sampled token is the most likely one
            self.assertAlmostEqual(tok_lp, max(top.values()), places=3, msg=c("greedy token logprob != top-1 logprob"))

    def test_sampling_params_that_reduce_to_greedy(self):
        ref = self.post_ok(COMPLETIONS, {"prompt": PROMPT, "max_tokens": 25, "temperature": 0})["choices"][0]["text"]
        for extra in ({"top_k": 1}, {"top_p": 1e-6}):
            req = dict({"prompt": PROMPT, "max_tokens": 25, "temperature": 1.0, "seed": 7}, **extra)
            out = self.post_ok(COMPLETIONS, req)
            self.assertEqual(out["choices"][0]["text"], ref, self.ctx("%s at temperature 1 must be greedy" % extra, req, out))

    def test_seed_reproducible_and_temperature_samples(self):
        req = {"prompt": PROMPT, "max_tokens": 40, "temperature": 1.0, "seed": 1234}
        a = self.post_ok(COMPLETIONS, req)["choices"][0]["text"]
        b = self.post_ok(COMPLETIONS, req)["choices"][0]["text"]
        self.assertEqual(a, b, self.ctx("same seed, different text: %r vs %r" % (a, b), req))
        sreq = dict(req, stream=True)
        s, _, _, _ = self.stream_ok(COMPLETIONS, sreq)
        self.assertEqual(s, a, self.ctx("same seed, streamed text differs", sreq))
        texts = {a}
        for seed in (1, 2, 3, 4):
            texts.add(self.post_ok(COMPLETIONS, dict(req, seed=seed))["choices"][0]["text"])
        self.assertGreater(len(texts), 1, self.ctx("temperature 1 with 5 seeds gave one text: seed/temperature ignored?", req))

    def test_logit_bias_forces_a_token(self):
        tok = PROMPT_IDS_NO_BOS[1]  # "▁upon"
        req = {"prompt": PROMPT, "max_tokens": 3, "temperature": 0, "logit_bias": {str(tok): 100}}
        out = self.post_ok(COMPLETIONS, req)
        text = out["choices"][0]["text"]
        self.assertEqual(text, " upon upon upon", self.ctx("logit_bias +100 on token %d" % tok, req, out))

    def test_unknown_fields_ignored_and_user_accepted(self):
        req = {"prompt": PROMPT, "max_tokens": 3, "temperature": 0, "user": "u-1", "frobnicate": {"x": [1]}, "n": 1}
        out = self.post_ok(COMPLETIONS, req)
        self.check_completion(out, req, chat=False)


# ---------------------------------------------------------------------------
# Chat completions
# ---------------------------------------------------------------------------

class ChatTests(ServerTestCase):
    MESSAGES = [{"role": "user", "content": PROMPT}]

    def test_non_stream_length(self):
        req = {"model": MODEL_NAME, "messages": self.MESSAGES, "max_tokens": 8, "temperature": 0}
        out = self.post_ok(CHAT, req)
        text, finish, usage = self.check_completion(out, req, chat=True)
        self.assertTrue(text, self.ctx("empty content", req, out))
        self.assertEqual(finish, "length", self.ctx("finish_reason", req, out))
        self.assertEqual(usage["completion_tokens"], 8, self.ctx("completion_tokens", req, out))

    def test_max_completion_tokens(self):
        req = {"messages": self.MESSAGES, "max_completion_tokens": 5, "temperature": 0}
        out = self.post_ok(CHAT, req)
        _, finish, usage = self.check_completion(out, req, chat=True)
        self.assertEqual(finish, "length", self.ctx("finish_reason", req, out))
        self.assertEqual(usage["completion_tokens"], 5, self.ctx("max_completion_tokens not honoured", req, out))

    def test_fallback_template(self):
        # No chat template: "<role>: <content>\n" per message, then "assistant:".
        rendered = "user: %s\nassistant:" % PROMPT
        req = {"messages": self.MESSAGES, "max_tokens": 20, "temperature": 0}
        out = self.post_ok(CHAT, req)
        text, _, usage = self.check_completion(out, req, chat=True)
        variants = {}
        for add_special in (True, False):
            ids = self.tokenize(rendered, add_special)
            ref = self.post_ok(COMPLETIONS, {"prompt": ids, "max_tokens": 20, "temperature": 0})["choices"][0]["text"]
            variants[add_special] = (len(ids), ref)
        matches = [v for v in variants.values() if v == (usage["prompt_tokens"], text)]
        self.assertTrue(matches, self.ctx("chat output/prompt_tokens %r do not match the completion of the fallback "
                                          "template %r (with BOS, without BOS: %r)"
                                          % ((usage["prompt_tokens"], text), rendered, variants), req, out))

    def test_stream_equals_non_stream(self):
        req = {"messages": self.MESSAGES, "max_tokens": 20, "temperature": 0}
        out = self.post_ok(CHAT, req)
        ref, ref_finish, _ = self.check_completion(out, req, chat=True)
        sreq = dict(req, stream=True)
        text, finish, _, chunks = self.stream_ok(CHAT, sreq)
        self.assertEqual(text, ref, self.ctx("streamed content != non-streamed at temperature 0", sreq, chunks))
        self.assertEqual(finish, "length")

    def test_stream_include_usage(self):
        req = {"messages": self.MESSAGES, "max_tokens": 10, "temperature": 0}
        out = self.post_ok(CHAT, req)
        ref, _, ref_usage = self.check_completion(out, req, chat=True)
        sreq = dict(req, stream=True, stream_options={"include_usage": True})
        text, finish, usage, chunks = self.stream_ok(CHAT, sreq, include_usage=True)
        self.assertEqual(text, ref)
        self.assertEqual(usage, ref_usage, self.ctx("streamed usage != non-streamed usage", sreq, chunks))

    def test_stop_from_greedy_output(self):
        req = {"messages": self.MESSAGES, "max_tokens": 30, "temperature": 0}
        ref = self.post_ok(CHAT, req)["choices"][0]["message"]["content"]
        words = ref.split()
        self.assertGreaterEqual(len(words), 4, self.ctx("greedy chat output too short to pick a stop word: %r" % ref, req))
        stop = " " + words[len(words) // 2]
        expected = ref[:ref.index(stop)]
        for stream in (False, True):
            sreq = dict(req, stop=[stop], stream=stream)
            if stream:
                text, finish, _, chunks = self.stream_ok(CHAT, sreq)
                resp = chunks
            else:
                resp = self.post_ok(CHAT, sreq)
                text, finish, _ = self.check_completion(resp, sreq, chat=True)
            self.assertEqual(finish, "stop", self.ctx("finish_reason", sreq, resp))
            self.assertEqual(text, expected, self.ctx("text before the stop string %r" % stop, sreq, resp))
            self.assertNotIn(stop, text)

    def test_logprobs(self):
        req = {"messages": self.MESSAGES, "max_tokens": 5, "temperature": 0, "logprobs": True, "top_logprobs": 2}
        out = self.post_ok(CHAT, req)
        text, _, usage = self.check_completion(out, req, chat=True)
        c = lambda m: self.ctx(m, req, out)  # noqa: E731
        lp = out["choices"][0]["logprobs"]
        self.assertIsInstance(lp, dict, c("choices[0].logprobs"))
        content = lp.get("content")
        self.assertIsInstance(content, list, c("logprobs.content"))
        self.assertEqual(len(content), 5, c("one logprobs.content entry per generated token"))
        self.assertEqual("".join(e.get("token", "") for e in content), text, c("logprobs tokens do not spell content"))
        for e in content:
            self.assertIsInstance(e.get("token"), str, c("entry.token"))
            self.assertIsInstance(e.get("logprob"), (int, float), c("entry.logprob"))
            self.assertLessEqual(e["logprob"], 1e-6, c("logprob > 0"))
            top = e.get("top_logprobs")
            self.assertIsInstance(top, list, c("entry.top_logprobs"))
            self.assertEqual(len(top), 2, c("top_logprobs 2 -> two alternatives"))
            for t in top:
                self.assertIsInstance(t.get("token"), str, c("top_logprobs[].token"))
                self.assertIsInstance(t.get("logprob"), (int, float), c("top_logprobs[].logprob"))
            self.assertGreaterEqual(top[0]["logprob"], top[1]["logprob"], c("top_logprobs not sorted"))
            self.assertAlmostEqual(e["logprob"], top[0]["logprob"], places=3, msg=c("greedy token is not the top-1"))
            self.assertEqual(e["token"], top[0]["token"], c("greedy token is not the top-1"))

    def test_logprobs_absent_by_default(self):
        req = {"messages": self.MESSAGES, "max_tokens": 3, "temperature": 0}
        out = self.post_ok(CHAT, req)
        self.assertIsNone(out["choices"][0].get("logprobs"), self.ctx("logprobs without asking", req, out))

    def test_seed_reproducible(self):
        req = {"messages": self.MESSAGES, "max_tokens": 30, "temperature": 1.0, "seed": 99}
        a = self.post_ok(CHAT, req)["choices"][0]["message"]["content"]
        b = self.post_ok(CHAT, req)["choices"][0]["message"]["content"]
        self.assertEqual(a, b, self.ctx("same seed, different content", req))


# ---------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------

class ErrorTests(ServerTestCase):
    def test_malformed_json(self):
        for path in (COMPLETIONS, CHAT):
            body = b'{"prompt": "hi", "max_tokens": '
            r = self.srv.post(path, body)
            self.assert_error(r, 400, "invalid_request_error", req="POST %s %r" % (path, body))
            r = self.srv.post(path, b"[1, 2, 3]")
            self.assert_error(r, 400, "invalid_request_error", req="POST %s [1,2,3] (not an object)" % path)

    def test_wrong_types(self):
        cases = [
            (COMPLETIONS, {"prompt": PROMPT, "max_tokens": "ten"}, "max_tokens"),
            (CHAT, {"messages": "hi"}, "messages"),
            (CHAT, {"messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}, "temperature"),
            (CHAT, {"messages": [{"role": "user", "content": "hi"}], "stream": "yes"}, "stream"),
            (COMPLETIONS, {"prompt": 42}, "prompt"),
            (COMPLETIONS, {"prompt": PROMPT, "stop": 5}, "stop"),
            (CHAT, {"messages": [{"role": "user", "content": "hi"}], "seed": "abc"}, "seed"),
            (CHAT, {"messages": [{"role": "user", "content": 5}]}, "messages"),
            (CHAT, {"messages": [{"role": 7, "content": "hi"}]}, "messages"),
            (CHAT, {"messages": ["hi"]}, "messages"),
        ]
        for path, body, field in cases:
            with self.subTest(path=path, field=field):
                r = self.srv.post(path, body)
                self.assert_error(r, 400, "invalid_request_error", req="POST %s %s" % (path, jdump(body)),
                                  param_field=field)

    def test_user_message_without_content_400(self):
        # OpenAI requires content on system/user messages (null is allowed only on assistant messages
        # that carry tool_calls); a server that accepts it silently generates from an empty turn.
        body = {"messages": [{"role": "user"}], "max_tokens": 3}
        r = self.srv.post(CHAT, body)
        self.assert_error(r, 400, "invalid_request_error", req="POST %s %s" % (CHAT, jdump(body)), param_field="messages")

    def test_missing_prompt_or_messages(self):
        for path, body in ((COMPLETIONS, {"max_tokens": 3}), (CHAT, {"max_tokens": 3})):
            r = self.srv.post(path, body)
            self.assert_error(r, 400, "invalid_request_error", req="POST %s %s" % (path, jdump(body)))

    def test_invalid_values(self):
        cases = [
            (COMPLETIONS, {"prompt": PROMPT, "n": 2}),
            (CHAT, {"messages": [{"role": "user", "content": "hi"}], "n": 2}),
            (COMPLETIONS, {"prompt": PROMPT, "max_tokens": -1}),
            (COMPLETIONS, {"prompt": PROMPT, "stop": ["a", "b", "c", "d", "e"]}),
            (COMPLETIONS, {"prompt": [1, 99999]}),  # token id outside the vocabulary (512)
        ]
        for path, body in cases:
            with self.subTest(path=path, body=body):
                r = self.srv.post(path, body)
                self.assert_error(r, 400, "invalid_request_error", req="POST %s %s" % (path, jdump(body)))

    def test_prompt_plus_max_tokens_over_context(self):
        body = {"prompt": PROMPT, "max_tokens": 100000}
        r = self.srv.post(COMPLETIONS, body)
        self.assert_error(r, 400, "invalid_request_error", req=body)

    def test_unknown_route_404(self):
        for method, path in (("GET", "/v1/nope"), ("POST", "/v2/completions"), ("GET", "/")):
            r = self.srv.request(method, path, {} if method == "POST" else None)
            self.assert_error(r, 404, "invalid_request_error", code="not_found", req="%s %s" % (method, path))

    def test_wrong_method_405(self):
        for method, path in (("GET", CHAT), ("GET", COMPLETIONS), ("DELETE", "/v1/models"), ("POST", "/health")):
            r = self.srv.request(method, path, {} if method == "POST" else None)
            self.assert_error(r, 405, req="%s %s" % (method, path))

    def test_405_has_allow_header(self):
        # RFC 9110 15.5.6: a 405 response MUST carry Allow.
        r = self.srv.get(CHAT)
        self.assertEqual(r.status, 405)
        allow = r.header("allow")
        self.assertIsNotNone(allow, self.ctx("405 without an Allow header", "GET " + CHAT, r))
        self.assertIn("POST", allow.upper(), self.ctx("Allow header", "GET " + CHAT, r))

    def test_unknown_model_404(self):
        for path, body in ((COMPLETIONS, {"model": "gpt-4", "prompt": PROMPT, "max_tokens": 2}),
                           (CHAT, {"model": "gpt-4", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}),
                           (CHAT, {"model": "gpt-4", "messages": [{"role": "user", "content": "hi"}], "stream": True})):
            r = self.srv.post(path, body)
            self.assert_error(r, 404, code="model_not_found", req="POST %s %s" % (path, jdump(body)))

    def test_empty_model_accepted(self):
        req = {"model": "", "prompt": PROMPT, "max_tokens": 2}
        out = self.post_ok(COMPLETIONS, req)
        self.assertEqual(out.get("model"), MODEL_NAME, self.ctx("model in the response", req, out))

    def test_connection_survives_an_error(self):
        # After a 400 on a keep-alive connection, the next request on it still works.
        with self.srv.connect() as c:
            r1 = c.request("POST", COMPLETIONS, b"{bad json")
            self.assertEqual(r1.status, 400, r1.describe())
            if (r1.header("connection") or "").lower() == "close":
                return  # closing after an error is allowed
            r2 = c.request("GET", "/health")
            self.assertEqual(r2.status, 200, r2.describe())


# ---------------------------------------------------------------------------
# Other endpoints
# ---------------------------------------------------------------------------

class EndpointTests(ServerTestCase):
    def test_health(self):
        r = self.srv.get("/health")
        self.assertEqual(r.status, 200, r.describe())
        self.assertEqual(r.json(), {"status": "ok"}, r.describe())

    def test_models(self):
        r = self.srv.get("/v1/models")
        self.assertEqual(r.status, 200, r.describe())
        out = r.json()
        self.assertEqual(out.get("object"), "list", r.describe())
        data = out.get("data")
        self.assertIsInstance(data, list, r.describe())
        self.assertEqual(len(data), 1, r.describe())
        m = data[0]
        self.assertEqual(m.get("id"), MODEL_NAME, r.describe())
        self.assertEqual(m.get("object"), "model", r.describe())
        self.assertEqual(m.get("owned_by"), "llm-server", r.describe())
        self.assertIsInstance(m.get("created"), int, r.describe())

    def test_tokenize_detokenize(self):
        self.assertEqual(self.tokenize(PROMPT, True), [BOS] + PROMPT_IDS_NO_BOS)
        self.assertEqual(self.tokenize(PROMPT, False), PROMPT_IDS_NO_BOS)
        for text in (PROMPT, "The cat sat, and then? It ran! 123", "café ☃ naïve 日本"):
            with self.subTest(text=text):
                toks = self.tokenize(text, False)
                self.assertTrue(toks)
                body = {"tokens": toks}
                out = self.post_ok("/detokenize", body)
                self.assertEqual(out.get("content"), text, self.ctx("detokenize(tokenize(x)) != x", body, out))

    def test_tokenize_bad_request(self):
        for body in ({"content": 5}, {"tokens": "x"}):
            path = "/tokenize" if "content" in body else "/detokenize"
            r = self.srv.post(path, body)
            self.assert_error(r, 400, "invalid_request_error", req="POST %s %s" % (path, jdump(body)))


class MetricsTests(ServerTestCase):
    NAMES = ["llm_requests_total", "llm_prompt_tokens_total", "llm_generation_tokens_total", "llm_requests_running",
             "llm_requests_queued", "llm_kv_cache_usage_ratio"]
    HISTOGRAMS = ["llm_time_to_first_token_seconds", "llm_time_per_output_token_seconds"]

    def scrape(self):
        r = self.srv.get("/metrics")
        self.assertEqual(r.status, 200, r.describe())
        ct = r.header("content-type") or ""
        self.assertTrue(ct.startswith("text/plain"), self.ctx("/metrics Content-Type %r" % ct, None, r))
        return r.text, parse_prometheus(r.text)

    @staticmethod
    def is_completions(e):
        return "completions" in e and "chat" not in e

    @staticmethod
    def is_chat(e):
        return "chat" in e

    def snapshot(self, samples):
        return {
            "text_200": metric_sum(samples, "llm_requests_total", endpoint=self.is_completions, status="200") or 0,
            "text_400": metric_sum(samples, "llm_requests_total", endpoint=self.is_completions, status="400") or 0,
            "chat_200": metric_sum(samples, "llm_requests_total", endpoint=self.is_chat, status="200") or 0,
            "prompt": metric_sum(samples, "llm_prompt_tokens_total"),
            "gen": metric_sum(samples, "llm_generation_tokens_total"),
            "ttft": metric_sum(samples, "llm_time_to_first_token_seconds_count"),
            "tpot": metric_sum(samples, "llm_time_per_output_token_seconds_count"),
        }

    def wait_idle(self):
        deadline = time.monotonic() + 10
        while True:
            _, s = self.scrape()
            if metric_sum(s, "llm_requests_running") == 0 and metric_sum(s, "llm_requests_queued") == 0:
                return s
            if time.monotonic() > deadline:
                self.fail("server not idle (llm_requests_running/queued != 0) 10 s after the last request")
            time.sleep(0.05)

    def test_names_and_histograms(self):
        text, samples = self.scrape()
        names = {n for n, _, _ in samples}
        for n in self.NAMES:
            self.assertIn(n, names, "metric %s missing from /metrics:\n%s" % (n, text))
        for h in self.HISTOGRAMS:
            self.assertIn("# TYPE %s histogram" % h, text, "histogram %s not declared:\n%s" % (h, text))
            for suffix in ("_bucket", "_sum", "_count"):
                self.assertIn(h + suffix, names, "%s%s missing:\n%s" % (h, suffix, text))
            inf = [v for n, lb, v in samples if n == h + "_bucket" and lb.get("le") in ("+Inf", "inf", "+inf")]
            self.assertEqual(len(inf), 1, "%s: one le=\"+Inf\" bucket expected:\n%s" % (h, text))
            self.assertEqual(inf[0], metric_sum(samples, h + "_count"), "%s: +Inf bucket != _count" % h)
            buckets = sorted((float(lb["le"]), v) for n, lb, v in samples if n == h + "_bucket")
            counts = [v for _, v in buckets]
            self.assertEqual(counts, sorted(counts), "%s buckets not cumulative:\n%s" % (h, text))
        for n in ("llm_requests_total", "llm_prompt_tokens_total", "llm_generation_tokens_total"):
            self.assertIn("# TYPE %s counter" % n, text, "%s not declared a counter" % n)
        for lb in (lb for n, lb, _ in samples if n == "llm_requests_total"):
            self.assertIn("endpoint", lb, "llm_requests_total without endpoint label:\n%s" % text)
            self.assertIn("status", lb, "llm_requests_total without status label:\n%s" % text)
        ratio = metric_sum(samples, "llm_kv_cache_usage_ratio")
        self.assertTrue(0.0 <= ratio <= 1.0, "llm_kv_cache_usage_ratio %r outside [0, 1]" % ratio)

    def wait_delta(self, before, expect, timeout=5.0):
        """Polls until every expected counter delta is reached; fails if one is exceeded or not reached."""
        deadline = time.monotonic() + timeout
        while True:
            text, samples = self.scrape()
            now = self.snapshot(samples)
            delta = {k: (now[k] or 0) - (before[k] or 0) for k in expect}
            if all(delta[k] == v for k, v in expect.items()):
                return now
            over = {k: delta[k] for k, v in expect.items() if delta[k] > v}
            if over or time.monotonic() > deadline:
                self.fail("metric deltas %r, expected %r\n%s" % (delta, expect, text))
            time.sleep(0.05)

    def test_counters_increase(self):
        samples = self.wait_idle()
        before = self.snapshot(samples)
        n_prompt = len(self.tokenize(PROMPT, True))
        req = {"prompt": PROMPT, "max_tokens": 7, "temperature": 0}
        out = self.post_ok(COMPLETIONS, req)
        self.assertEqual(out["usage"]["completion_tokens"], 7)
        after = self.wait_delta(before, {"text_200": 1, "prompt": n_prompt, "gen": 7, "ttft": 1})
        self.assertGreater(after["tpot"], before["tpot"] or 0, "llm_time_per_output_token_seconds not observed")
        # a streamed chat request counts too
        before = after
        sreq = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "temperature": 0, "stream": True}
        self.stream_ok(CHAT, sreq)
        self.wait_delta(before, {"chat_200": 1, "gen": 4, "ttft": 1})
        # and so does an error
        before = self.snapshot(self.scrape()[1])
        r = self.srv.post(COMPLETIONS, b"{nope")
        self.assertEqual(r.status, 400)
        self.wait_delta(before, {"text_400": 1, "text_200": 0, "gen": 0})
        idle = self.wait_idle()
        self.assertEqual(metric_sum(idle, "llm_kv_cache_usage_ratio"), 0.0,
                         "llm_kv_cache_usage_ratio not 0 with no request running")


# ---------------------------------------------------------------------------
# Connections and concurrency
# ---------------------------------------------------------------------------

class ConnectionTests(ServerTestCase):
    def test_keep_alive(self):
        with self.srv.connect() as c:
            port = c.local_port()
            r1 = c.request("GET", "/health")
            self.assertEqual(r1.status, 200, r1.describe())
            self.assertNotEqual((r1.header("connection") or "").lower(), "close", r1.describe())
            req = {"prompt": PROMPT, "max_tokens": 5, "temperature": 0}
            r2 = c.request("POST", COMPLETIONS, req)
            self.assertEqual(r2.status, 200, r2.describe())
            self.assertTrue(GREEDY.startswith(r2.json()["choices"][0]["text"]), r2.describe())
            sreq = dict(req, stream=True)
            c.send_request("POST", COMPLETIONS, sreq)
            r3 = c.read_head()
            self.assertEqual(r3.status, 200, r3.describe())
            events = harness.SSEStream(c, r3).read_all(30)
            self.assertEqual(events[-1], "[DONE]", events)
            r4 = c.request("GET", "/v1/models")
            self.assertEqual(r4.status, 200, r4.describe())
            self.assertEqual(c.local_port(), port)
            self.assertFalse(c.eof, "the server closed the keep-alive connection")

    def test_expect_100_continue(self):
        # Clients that send "Expect: 100-continue" hold the body back until the
        # server says so (curl waits a second otherwise).
        with self.srv.connect() as c:
            body = json.dumps({"prompt": PROMPT, "max_tokens": 5, "temperature": 0}).encode()
            head = ("POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
                    "Expect: 100-continue\r\n\r\n" % (COMPLETIONS, len(body))).encode()
            c.send_raw(head)
            c._method = "POST"  # what read_head() needs to know about the request
            interim = c._read_until(b"\r\n\r\n", time.monotonic() + 2.0)
            self.assertTrue(interim.startswith(b"HTTP/1.1 100 Continue"), interim)
            c.send_raw(body)
            r = c.read_head()
            self.assertEqual(r.status, 200, r.describe())
            text = json.loads(c.read_body().decode())["choices"][0]["text"]
            self.assertTrue(GREEDY.startswith(text), text)

    def test_pipelined_requests(self):
        # Two requests written at once on one connection: both answered, in order.
        with self.srv.connect() as c:
            body = json.dumps({"content": PROMPT, "add_special": False}).encode()
            one = ("POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                   % len(body)).encode() + body
            two = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
            c.send_raw(one + two)
            c._method = "POST"
            r1 = c.read_head()
            r1.body = c.read_body()
            c._method = "GET"
            r2 = c.read_head()
            r2.body = c.read_body()
            self.assertEqual(r1.status, 200, r1.describe())
            self.assertEqual(r1.json(), {"tokens": PROMPT_IDS_NO_BOS}, r1.describe())
            self.assertEqual(r2.status, 200, r2.describe())
            self.assertEqual(r2.json(), {"status": "ok"}, r2.describe())

    def test_concurrent_streams(self):
        prompts = [PROMPT, "The little dog"]
        refs = {}
        for p in prompts:
            refs[p] = self.post_ok(COMPLETIONS, {"prompt": p, "max_tokens": 40, "temperature": 0})["choices"][0]["text"]
        n = 8
        barrier = threading.Barrier(n, timeout=30)
        results = [None] * n

        def client(i):
            req = {"prompt": prompts[i % 2], "max_tokens": 40, "temperature": 0, "stream": True}
            try:
                barrier.wait()
                resp, events = self.srv.stream(COMPLETIONS, req, timeout=60)
                results[i] = (req, resp, events, None)
            except BaseException as e:  # reported below
                results[i] = (req, None, None, e)

        threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(n)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 90
        for t in threads:
            t.join(max(0.1, deadline - time.monotonic()))
        self.assertFalse([t for t in threads if t.is_alive()], "streaming clients still running after 90 s")
        ids = set()
        for i, (req, resp, events, exc) in enumerate(results):
            self.assertIsNone(exc, self.ctx("client %d raised %r" % (i, exc), req))
            text, finish, _, chunks = self.check_stream(resp, events, req, chat=False)
            self.assertTrue(text, self.ctx("client %d: empty text" % i, req, chunks))
            self.assertEqual(text, refs[req["prompt"]],
                             self.ctx("client %d: concurrent greedy text differs from the sequential one" % i, req, chunks))
            ids.add(chunks[0]["id"])
        self.assertEqual(len(ids), n, "stream ids are not unique: %s" % ids)


# ---------------------------------------------------------------------------
# A server with --api-key, --cors-origin, --max-body-bytes, --ctx 64, --timeout-seconds 2, --model-alias
# ---------------------------------------------------------------------------

API_KEY = "sk-test-4f8b2c"
ORIGIN = "http://app.example.test"
ALIAS = "tiny-stories"


class RestrictedServerTests(ServerTestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = ServerProcess(ARGS.server_bin, model_dir(MODEL_NAME), [
            "--api-key", API_KEY, "--cors-origin", ORIGIN, "--max-body-bytes", "1000", "--ctx", "64",
            "--timeout-seconds", "2", "--model-alias", ALIAS, "--parallel", "2"], name="restricted")
        cls.addClassCleanup(cls._stop)
        cls.server.start()

    @classmethod
    def _stop(cls):
        cls.server.stop(timeout=15)

    AUTH = {"Authorization": "Bearer " + API_KEY}

    def model_name(self):
        return ALIAS

    def test_health_needs_no_key(self):
        r = self.srv.get("/health")
        self.assertEqual(r.status, 200, r.describe())

    def test_missing_or_wrong_key_401(self):
        body = {"prompt": PROMPT, "max_tokens": 2}
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": API_KEY},
                        {"Authorization": "Basic " + API_KEY}, {"Authorization": "Bearer " + API_KEY + "x"}):
            with self.subTest(headers=headers):
                r = self.srv.post(COMPLETIONS, body, headers)
                self.assert_error(r, 401, "authentication_error", req="POST %s headers %s" % (COMPLETIONS, headers))
        r = self.srv.get("/v1/models")
        self.assert_error(r, 401, "authentication_error", req="GET /v1/models without a key")

    def test_correct_key(self):
        r = self.srv.get("/v1/models", self.AUTH)
        self.assertEqual(r.status, 200, r.describe())
        self.assertEqual([m["id"] for m in r.json()["data"]], [ALIAS], r.describe())
        for model in (ALIAS, None):
            req = {"prompt": PROMPT, "max_tokens": 4, "temperature": 0}
            if model:
                req["model"] = model
            out = self.post_ok(COMPLETIONS, req, self.AUTH)
            text, finish, _ = self.check_completion(out, req, chat=False)
            self.assertEqual(out["model"], ALIAS, self.ctx("model in the response must be the alias", req, out))
            self.assertTrue(GREEDY.startswith(text), self.ctx("greedy text", req, out))
        sreq = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "stream": True}
        resp, events = self.srv.stream(CHAT, sreq, self.AUTH)
        self.check_stream(resp, events, sreq, chat=True)

    def test_directory_name_accepted_with_alias(self):
        # Contract: a request model that is the alias OR the directory name is served.
        req = {"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": 4, "temperature": 0}
        out = self.post_ok(COMPLETIONS, req, self.AUTH)
        text, _, _ = self.check_completion(out, req | {"model": ALIAS}, chat=False)
        self.assertTrue(GREEDY.startswith(text), self.ctx("greedy text", req, out))

    def test_unknown_model_with_alias(self):
        req = {"model": "stories", "prompt": PROMPT, "max_tokens": 2}
        r = self.srv.post(COMPLETIONS, req, self.AUTH)
        self.assert_error(r, 404, code="model_not_found", req=req)

    def test_cors_preflight(self):
        for path in (CHAT, "/v1/models"):
            with self.subTest(path=path):
                headers = {"Origin": ORIGIN, "Access-Control-Request-Method": "POST",
                           "Access-Control-Request-Headers": "authorization, content-type"}
                r = self.srv.request("OPTIONS", path, None, headers)
                self.assertEqual(r.status, 204, self.ctx("OPTIONS %s" % path, headers, r))
                self.assertEqual(r.header("access-control-allow-origin"), ORIGIN, self.ctx("ACAO", headers, r))
                methods = (r.header("access-control-allow-methods") or "").upper()
                self.assertIn("POST", methods, self.ctx("Access-Control-Allow-Methods", headers, r))
                allowed = (r.header("access-control-allow-headers") or "").lower()
                self.assertIn("authorization", allowed, self.ctx("Access-Control-Allow-Headers", headers, r))
                self.assertIn("content-type", allowed, self.ctx("Access-Control-Allow-Headers", headers, r))

    def test_cors_header_on_responses(self):
        h = {"Origin": ORIGIN}
        checks = [("GET", "/health", None, {}), ("GET", "/v1/models", None, self.AUTH),
                  ("POST", COMPLETIONS, {"prompt": PROMPT, "max_tokens": 2}, self.AUTH),
                  ("POST", COMPLETIONS, {"prompt": PROMPT, "max_tokens": 2}, {})]  # a 401 too
        for method, path, body, auth in checks:
            with self.subTest(method=method, path=path, auth=bool(auth)):
                r = self.srv.request(method, path, body, dict(h, **auth))
                self.assertIn(r.status, (200, 401), r.describe())
                self.assertEqual(r.header("access-control-allow-origin"), ORIGIN,
                                 self.ctx("%s %s: Access-Control-Allow-Origin" % (method, path), body, r))
        sreq = {"prompt": PROMPT, "max_tokens": 2, "stream": True}
        c, resp, sse = self.srv.open_stream(COMPLETIONS, sreq, dict(h, **self.AUTH))
        with c:
            self.assertEqual(resp.status, 200, resp.describe())
            self.assertEqual(resp.header("access-control-allow-origin"), ORIGIN, self.ctx("stream ACAO", sreq, resp))
            sse.read_all(30)

    def test_body_too_large_413(self):
        body = json.dumps({"prompt": "x" * 4980, "max_tokens": 1}).encode()
        self.assertGreater(len(body), 4990)
        try:
            r = self.srv.post(COMPLETIONS, body, self.AUTH)
        except (ConnectionError, EOFError) as e:
            self.fail(self.ctx("POST of %d bytes with --max-body-bytes 1000: the connection failed (%r) "
                               "instead of a 413 response" % (len(body), e)))
        self.assert_error(r, 413, req="POST %s with a %d-byte body (--max-body-bytes 1000)" % (COMPLETIONS, len(body)))

    def test_body_under_limit_accepted(self):
        req = {"prompt": PROMPT, "max_tokens": 2, "padding": "p" * 850}
        raw = json.dumps(req).encode()
        self.assertTrue(900 < len(raw) <= 1000, len(raw))
        out = self.post_ok(COMPLETIONS, raw, self.AUTH)
        self.assertEqual(out["usage"]["completion_tokens"], 2)

    def test_prompt_longer_than_context_400(self):
        prompt = PROMPT
        while True:
            n = len(self.tokenize(prompt, True, headers=self.AUTH))
            if n > 80:
                break
            prompt += " and the dog ran to the park"
        req = {"prompt": prompt, "max_tokens": 4}
        self.assertLess(len(json.dumps(req)), 1000)
        for path, body in ((COMPLETIONS, req), (COMPLETIONS, dict(req, stream=True))):
            r = self.srv.post(path, body, self.AUTH)
            err = self.assert_error(r, 400, "invalid_request_error", req=body)
            self.assertIn(str(n), err["message"], self.ctx("message lacks the prompt length %d" % n, body, r))
            self.assertIn("64", err["message"], self.ctx("message lacks the context size 64", body, r))

    def test_slow_headers_idle_disconnected(self):
        """A client that sends half a request head and then nothing is cut off after --timeout-seconds 2."""
        elapsed, got = self._slow_client(drip=False)
        self.assertGreaterEqual(elapsed, 1.0, "disconnected after %.2f s, before the 2 s timeout" % elapsed)
        self.assertLessEqual(elapsed, 6.0, "idle half request not disconnected within 6 s (--timeout-seconds 2)")

    def test_slow_loris_drip_disconnected(self):
        """A client that keeps trickling header bytes (one every 0.3 s) is cut off too."""
        elapsed, got = self._slow_client(drip=True)
        self.assertGreaterEqual(elapsed, 1.0, "disconnected after %.2f s, before the 2 s timeout" % elapsed)
        self.assertLessEqual(elapsed, 6.0, "dripping client not disconnected within 6 s (--timeout-seconds 2)")

    def _slow_client(self, drip, limit=10.0):
        s = socket.create_connection((self.srv.host, self.srv.port), timeout=5)
        try:
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
            t0 = time.monotonic()
            got = b""
            filler = b"X-Slow-" + b"a" * 4000
            i = 0
            while time.monotonic() - t0 < limit:
                if drip:
                    try:
                        s.sendall(filler[i % len(filler):i % len(filler) + 1])
                        i += 1
                    except OSError:
                        return time.monotonic() - t0, got
                r, _, _ = select.select([s], [], [], 0.3)
                if r:
                    try:
                        data = s.recv(4096)
                    except OSError:
                        return time.monotonic() - t0, got
                    if not data:
                        return time.monotonic() - t0, got
                    got += data  # e.g. a 408 response before the close
            self.fail("connection still open %.0f s after a slow request head (--timeout-seconds 2); got %r\n%s"
                      % (limit, got[:300], self.srv.log(20)))
        finally:
            s.close()


# ---------------------------------------------------------------------------
# --parallel 1 --max-queue 0: queue full, disconnects
# ---------------------------------------------------------------------------

LONG_MODEL = "tiny-qwen2"
LONG_MAX_TOKENS = 16000


def long_request(stream=True):
    return {"prompt": PROMPT, "max_tokens": LONG_MAX_TOKENS, "ignore_eos": True, "temperature": 0, "stream": stream}


class SlotTests(ServerTestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = ServerProcess(ARGS.server_bin, model_dir(LONG_MODEL), [
            "--parallel", "1", "--max-queue", "0", "--ctx", "16384"], name="slot")
        cls.addClassCleanup(cls._stop)
        cls.server.start()

    @classmethod
    def _stop(cls):
        cls.server.stop(timeout=20)

    def model_name(self):
        return LONG_MODEL

    def metrics(self):
        r = self.srv.get("/metrics", timeout=10)
        self.assertEqual(r.status, 200, r.describe())
        return parse_prometheus(r.text)

    def wait_running(self, want, timeout):
        deadline = time.monotonic() + timeout
        while True:
            s = self.metrics()
            if metric_sum(s, "llm_requests_running") == want:
                return s
            if time.monotonic() > deadline:
                self.fail("llm_requests_running != %d after %.0f s (%r)\n%s" % (
                    want, timeout, metric_sum(s, "llm_requests_running"), self.srv.log(25)))
            time.sleep(0.05)

    def start_long_stream(self, n_events=3):
        req = long_request()
        c, resp, sse = self.srv.open_stream(COMPLETIONS, req)
        self.addCleanup(c.close)
        if resp.status != 200:
            resp.body = c.read_body(10)
            self.fail(self.ctx("long stream refused", req, resp))
        for _ in range(n_events):
            ev = sse.next_event(timeout=20)
            self.assertIsNotNone(ev, self.ctx("long stream ended early", req, sse.raw))
            self.assertNotEqual(ev, "[DONE]", self.ctx("long stream ended early", req, sse.raw))
        return req, c, sse

    def test_queue_full_429(self):
        self.wait_running(0, 10)
        req, c, sse = self.start_long_stream()
        try:
            s = self.wait_running(1, 5)
            self.assertEqual(metric_sum(s, "llm_requests_queued"), 0)
            for body in ({"prompt": PROMPT, "max_tokens": 2}, {"prompt": PROMPT, "max_tokens": 2, "stream": True},
                         {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}):
                path = CHAT if "messages" in body else COMPLETIONS
                with self.subTest(body=body):
                    r = self.srv.post(path, body, timeout=10)
                    self.assert_error(r, 429, ("rate_limit_error", "server_error"),
                                      req="POST %s %s while the only slot streams and --max-queue 0" % (path, jdump(body)))
            # the running stream is unaffected
            ev = sse.next_event(timeout=10)
            self.assertIsNotNone(ev)
            self.assertNotIn("error", json.loads(ev))
        finally:
            c.abort()
        self.wait_running(0, 5)
        out = self.post_ok(COMPLETIONS, {"prompt": PROMPT, "max_tokens": 2})
        self.assertEqual(out["usage"]["completion_tokens"], 2)

    def test_client_killed_mid_stream_frees_slot(self):
        self.wait_running(0, 10)
        gen_before = metric_sum(self.metrics(), "llm_generation_tokens_total")
        req, c, sse = self.start_long_stream(n_events=5)
        self.wait_running(1, 5)
        t0 = time.monotonic()
        c.abort()  # the client dies: RST, no more reads
        # The next request is served promptly (the slot is free long before the 16000 tokens would be done).
        req2 = {"prompt": PROMPT, "max_tokens": 3, "temperature": 0}
        r = None
        while time.monotonic() - t0 < 5:
            r = self.srv.post(COMPLETIONS, req2, timeout=10)
            if r.status != 429:
                break
            time.sleep(0.05)
        self.assertEqual(r.status, 200, self.ctx("request after the killed client (%.1f s later)"
                                                 % (time.monotonic() - t0), req2, r))
        self.assertLess(time.monotonic() - t0, 5.0, "slot not freed within 5 s of the client disconnect")
        s = self.wait_running(0, 5)
        gen = metric_sum(s, "llm_generation_tokens_total") - gen_before
        self.assertLess(gen, LONG_MAX_TOKENS / 2,
                        "the killed request generated %d tokens: not cancelled on disconnect" % gen)

    def test_non_stream_client_gone_frees_slot(self):
        # A non-streaming client that gives up also frees its slot.
        self.wait_running(0, 10)
        c = self.srv.connect()
        self.addCleanup(c.close)
        c.send_request("POST", COMPLETIONS, long_request(stream=False))
        self.wait_running(1, 5)
        c.abort()
        self.wait_running(0, 5)


# ---------------------------------------------------------------------------
# Graceful shutdown
# ---------------------------------------------------------------------------

class ShutdownTests(ServerTestCase):
    SHUTDOWN_TIMEOUT = 2
    expect_exit = True

    def model_name(self):
        return LONG_MODEL

    def test_sigterm_during_stream(self):
        srv = ServerProcess(ARGS.server_bin, model_dir(LONG_MODEL), [
            "--parallel", "1", "--ctx", "16384", "--shutdown-timeout-seconds", str(self.SHUTDOWN_TIMEOUT)],
            name="shutdown")
        self.server = srv
        self.addCleanup(srv.kill)
        srv.start()
        req = long_request()
        c, resp, sse = srv.open_stream(COMPLETIONS, req)
        self.addCleanup(c.close)
        self.assertEqual(resp.status, 200, resp.describe())
        for _ in range(3):
            ev = sse.next_event(timeout=20)
            self.assertTrue(ev and ev != "[DONE]", sse.raw)
        n_before = len(sse.raw)

        outcome = {}

        def reader():
            try:
                while True:
                    ev = sse.next_event(timeout=30)
                    if ev is None:
                        outcome["end"] = "eof"
                        break
                    if ev == "[DONE]":
                        outcome["end"] = "done"
                        rest = c.read_body_piece(timeout=5)  # the body must end after [DONE]
                        outcome["after_done"] = rest
                        break
            except (OSError, EOFError) as e:
                outcome["end"] = "closed: %r" % e
            except BaseException as e:
                outcome["end"] = "error: %r" % e
            outcome["t"] = time.monotonic()

        t0 = time.monotonic()
        srv.signal(signal.SIGTERM)
        th = threading.Thread(target=reader, daemon=True)
        th.start()

        # While draining, new requests are not served: refused, reset, or 503.
        rejected, last = False, None
        while time.monotonic() - t0 < 1.5 and not rejected:
            try:
                r = srv.post(COMPLETIONS, {"prompt": PROMPT, "max_tokens": 2}, timeout=5)
                last = r
                if r.status == 503:
                    rejected = True
                    self.assert_error(r, 503, srv=srv, req="POST during shutdown")
            except (ConnectionError, EOFError, socket.timeout, OSError) as e:
                last = e
                rejected = True
            if not rejected:
                time.sleep(0.05)
        self.assertTrue(rejected, self.ctx("new requests still served 1.5 s after SIGTERM; last: %s"
                                           % (last.describe() if hasattr(last, "describe") else last), srv=srv))

        code = srv.wait_exit(self.SHUTDOWN_TIMEOUT + 8)
        t_exit = time.monotonic() - t0
        if code is None:
            srv.kill()
            self.fail(self.ctx("server still running %d s after SIGTERM (--shutdown-timeout-seconds %d)"
                               % (self.SHUTDOWN_TIMEOUT + 8, self.SHUTDOWN_TIMEOUT), srv=srv))
        srv._join_drains()
        self.assertEqual(code, 0, self.ctx("exit code after SIGTERM", srv=srv))
        th.join(10)
        self.assertFalse(th.is_alive(), "the stream did not end after the server exited")
        end = outcome.get("end", "")
        self.assertFalse(end.startswith("error"), "stream reader: %s; events %s" % (end, sse.raw[-5:]))
        after = sse.raw[n_before:]
        if end == "done":
            self.assertEqual(outcome.get("after_done"), b"", "bytes after [DONE]: %r" % outcome.get("after_done"))
            self.assertGreaterEqual(len(after), 2, "[DONE] without a final chunk or error event: %s" % after)
            last_ev = json.loads(after[-2])
            if "error" in last_ev:
                self.assertIsInstance(last_ev["error"], dict, last_ev)
                self.assertIn("message", last_ev["error"], last_ev)
            else:
                self.assertIn(last_ev["choices"][0].get("finish_reason"), ("stop", "length"), after[-3:])
        finished_normally = end == "done" and "error" not in json.loads(after[-2]) and \
            json.loads(after[-2])["choices"][0].get("finish_reason") == "length"
        if not finished_normally:
            # The running stream got its grace period rather than being cut at once.
            self.assertGreaterEqual(t_exit, self.SHUTDOWN_TIMEOUT * 0.5,
                                    "server exited %.2f s after SIGTERM, cutting the running stream before "
                                    "--shutdown-timeout-seconds %d" % (t_exit, self.SHUTDOWN_TIMEOUT))
            self.assertGreater(len(after), 5, "the stream did not go on during the grace period (%d events)" % len(after))
        # New connections are refused afterwards.
        with self.assertRaises(ConnectionRefusedError):
            socket.create_connection((srv.host, srv.port), timeout=5).close()


# ---------------------------------------------------------------------------

def main():
    global ARGS
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--server-bin", required=True, help="path to the llm-server binary")
    ap.add_argument("--models", required=True, help="directory holding stories260K and tiny-qwen2")
    ARGS, rest = ap.parse_known_args()
    ARGS.server_bin = os.path.abspath(ARGS.server_bin)
    ARGS.models = os.path.abspath(ARGS.models)
    for path in (ARGS.server_bin, model_dir(MODEL_NAME), model_dir(LONG_MODEL)):
        if not os.path.exists(path):
            print("missing %s" % path, file=sys.stderr)
            print("server: 0 passed, 1 failed")
            return 1

    def on_signal(signum, frame):
        harness.kill_all_servers()
        raise KeyboardInterrupt("signal %d" % signum)

    signal.signal(signal.SIGTERM, on_signal)
    atexit.register(harness.kill_all_servers)
    t0 = time.monotonic()
    try:
        prog = unittest.main(module=sys.modules[__name__], argv=[sys.argv[0]] + rest, exit=False, verbosity=2)
    finally:
        harness.kill_all_servers()
    res = prog.result
    failing = set()       # distinct failing tests (subtest failures count once per test)
    setup_errors = 0      # setUpModule / setUpClass / cleanup errors (not tests)
    for t, _ in res.failures + res.errors:
        case = getattr(t, "test_case", t)
        if isinstance(case, unittest.TestCase):
            failing.add(case.id())
        else:
            setup_errors += 1
    for t in res.unexpectedSuccesses:
        failing.add(t.id())
    failed = len(failing) + setup_errors
    passed = max(0, res.testsRun - len(failing) - len(res.skipped) - len(res.expectedFailures))
    print("server: total %.1f s" % (time.monotonic() - t0))
    print("server: %d passed, %d failed" % (passed, failed))
    return 1 if failed or res.testsRun == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
