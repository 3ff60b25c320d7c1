// Sampling rules: each truncation never picks outside its set, seeds repeat,
// penalties and biases move the right logits, logprobs are the model's.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>

#include "engine/sampler.h"
#include "engine/stop_matcher.h"

using namespace llm::engine;

namespace {

// Logits whose softmax is the given probabilities.
std::vector<float> logits_for(const std::vector<double>& p) {
  std::vector<float> l;
  for (double x : p) l.push_back(static_cast<float>(std::log(x)));
  return l;
}

std::set<int32_t> draw(SamplingParams params, const std::vector<float>& logits, int n) {
  params.seed = 1234;
  Sampler s(params, static_cast<int32_t>(logits.size()));
  std::set<int32_t> seen;
  for (int i = 0; i < n; ++i) {
    std::vector<float> l = logits;
    seen.insert(s.sample(l).id);
  }
  return seen;
}

}  // namespace

TEST_CASE("greedy picks the argmax, the lowest id on ties") {
  SamplingParams p;
  p.temperature = 0.0f;
  Sampler s(p, 5);
  std::vector<float> l = {0.1f, 3.0f, -1.0f, 3.0f, 2.9f};
  CHECK(s.sample(l).id == 1);
}

TEST_CASE("top-k, top-p and min-p never pick outside their sets") {
  // Probabilities 0.4, 0.25, 0.15, 0.1, 0.05, 0.03, 0.02.
  const auto logits = logits_for({0.4, 0.25, 0.15, 0.1, 0.05, 0.03, 0.02});
  SamplingParams p;
  p.temperature = 1.0f;
  SUBCASE("top_k = 3") {
    p.top_k = 3;
    CHECK(draw(p, logits, 3000) == std::set<int32_t>{0, 1, 2});
  }
  SUBCASE("top_p = 0.75: smallest prefix reaching 0.75 is {0, 1, 2} (0.8)") {
    p.top_p = 0.75f;
    CHECK(draw(p, logits, 3000) == std::set<int32_t>{0, 1, 2});
  }
  SUBCASE("top_p = 0.35 keeps only the most likely token (p = 0.4)") {
    p.top_p = 0.35f;
    CHECK(draw(p, logits, 500) == std::set<int32_t>{0});
  }
  SUBCASE("min_p = 0.3: tokens with p >= 0.12") {
    p.min_p = 0.3f;
    CHECK(draw(p, logits, 3000) == std::set<int32_t>{0, 1, 2});
  }
  SUBCASE("all combined with low temperature") {
    p.top_k = 5;
    p.top_p = 0.9f;
    p.min_p = 0.2f;
    p.temperature = 0.7f;
    const auto s = draw(p, logits, 3000);
    CHECK(s.size() >= 2);
    for (int32_t id : s) CHECK(id <= 2);
  }
  SUBCASE("no truncation reaches the whole vocabulary") {
    CHECK(draw(p, logits, 20000).size() == 7);
  }
}

TEST_CASE("top-p over a large vocabulary with a flat tail falls back to the full sort") {
  // 5000 tokens of equal probability: the top-p set is 4500 tokens, beyond the sorted head.
  std::vector<float> logits(5000, 0.0f);
  SamplingParams p;
  p.top_p = 0.9f;
  p.seed = 7;
  Sampler s(p, 5000);
  std::set<int32_t> seen;
  for (int i = 0; i < 20000; ++i) {
    std::vector<float> l = logits;
    seen.insert(s.sample(l).id);
  }
  CHECK(*seen.rbegin() < 4500);  // ties broken by id: the kept set is ids 0..4499
  CHECK(seen.size() > 4000);
}

TEST_CASE("sampling frequencies follow the probabilities") {
  const auto logits = logits_for({0.5, 0.3, 0.2});
  SamplingParams p;
  p.seed = 99;
  Sampler s(p, 3);
  std::vector<int> counts(3, 0);
  const int n = 30000;
  for (int i = 0; i < n; ++i) {
    std::vector<float> l = logits;
    ++counts[static_cast<size_t>(s.sample(l).id)];
  }
  CHECK(counts[0] / double(n) == doctest::Approx(0.5).epsilon(0.03));
  CHECK(counts[1] / double(n) == doctest::Approx(0.3).epsilon(0.05));
  CHECK(counts[2] / double(n) == doctest::Approx(0.2).epsilon(0.05));
}

TEST_CASE("the same seed gives the same sequence; another seed differs") {
  std::vector<float> logits(1000);
  std::iota(logits.begin(), logits.end(), 0.0f);
  for (float& l : logits) l = std::sin(l) * 3.0f;
  auto run = [&](uint64_t seed) {
    SamplingParams p;
    p.temperature = 1.5f;
    p.top_p = 0.95f;
    p.seed = seed;
    Sampler s(p, 1000);
    std::vector<int32_t> out;
    for (int i = 0; i < 50; ++i) {
      std::vector<float> l = logits;
      out.push_back(s.sample(l).id);
    }
    return out;
  };
  CHECK(run(5) == run(5));
  CHECK(run(5) != run(6));
}

TEST_CASE("logit bias, repetition, presence and frequency penalties") {
  SamplingParams p;
  p.temperature = 0.0f;
  SUBCASE("bias forces a token") {
    p.logit_bias = {{2, 100.0f}};
    Sampler s(p, 3);
    std::vector<float> l = {5.0f, 4.0f, -3.0f};
    CHECK(s.sample(l).id == 2);
  }
  SUBCASE("bias -100 bans a token") {
    p.logit_bias = {{0, -100.0f}};
    Sampler s(p, 3);
    std::vector<float> l = {5.0f, 4.0f, -3.0f};
    CHECK(s.sample(l).id == 1);
  }
  SUBCASE("repetition penalty divides positive and multiplies negative logits of seen tokens") {
    p.repetition_penalty = 2.0f;
    Sampler s(p, 4);
    s.add_prompt(std::vector<int32_t>{0, 3});
    std::vector<float> l = {4.0f, 3.0f, 1.0f, -1.0f};
    CHECK(s.sample(l).id == 1);
    CHECK(l[0] == 2.0f);
    CHECK(l[3] == -2.0f);
    CHECK(l[1] == 3.0f);
  }
  SUBCASE("presence and frequency penalties count generated tokens only") {
    p.presence_penalty = 0.5f;
    p.frequency_penalty = 0.25f;
    Sampler s(p, 3);
    s.add_prompt(std::vector<int32_t>{2});
    s.add_generated(0);
    s.add_generated(0);
    s.add_generated(1);
    std::vector<float> l = {3.0f, 3.0f, 3.0f};
    CHECK(s.sample(l).id == 2);
    CHECK(l[0] == doctest::Approx(3.0 - 0.5 - 0.5));
    CHECK(l[1] == doctest::Approx(3.0 - 0.5 - 0.25));
    CHECK(l[2] == 3.0f);
  }
}

TEST_CASE("logprobs are the model's log-softmax, with the top alternatives") {
  SamplingParams p;
  p.temperature = 0.0f;
  p.logprobs = true;
  p.n_top_logprobs = 2;
  p.logit_bias = {{2, 50.0f}};  // changes the pick, not the reported distribution
  Sampler s(p, 3);
  std::vector<float> l = {2.0f, 1.0f, 0.0f};
  const Sampled r = s.sample(l);
  const double z = std::log(std::exp(2.0) + std::exp(1.0) + std::exp(0.0));
  CHECK(r.id == 2);
  REQUIRE(r.logprob.has_value());
  CHECK(*r.logprob == doctest::Approx(0.0 - z));
  REQUIRE(r.top.size() == 2);
  CHECK(r.top[0].id == 0);
  CHECK(r.top[0].logprob == doctest::Approx(2.0 - z));
  CHECK(r.top[1].id == 1);
}

TEST_CASE("invalid parameters are named") {
  SamplingParams p;
  CHECK(validate(p, 10).empty());
  p.top_p = 0.0f;
  CHECK(validate(p, 10).find("top_p") != std::string::npos);
  p = {};
  p.temperature = -1.0f;
  CHECK(validate(p, 10).find("temperature") != std::string::npos);
  p = {};
  p.logit_bias = {{10, 1.0f}};
  CHECK(validate(p, 10).find("outside the vocabulary") != std::string::npos);
  p = {};
  p.n_top_logprobs = 21;
  CHECK(validate(p, 10).find("top_logprobs") != std::string::npos);
}

TEST_CASE("stop strings split across tokens are caught and never leaked") {
  StopMatcher m({"END", "\n\n"});
  std::string out;
  out += m.push("Hello E");
  CHECK(out == "Hello ");  // "E" could start "END": held
  out += m.push("N");
  CHECK(out == "Hello ");
  out += m.push("Dless");
  CHECK(m.stopped());
  CHECK(m.matched() == "END");
  CHECK(out == "Hello ");
  CHECK(m.push("more").empty());
  CHECK(m.flush().empty());
}

TEST_CASE("held text that turns out not to be a stop string is released") {
  StopMatcher m({"stop here"});
  std::string out = m.push("we sto");
  CHECK(out == "we ");
  out += m.push("od still");
  CHECK(out == "we stood still");
  out += m.push(" st");
  out += m.flush();
  CHECK(out == "we stood still st");
  CHECK_FALSE(m.stopped());
}

TEST_CASE("the earliest stop string wins, even inside one piece") {
  StopMatcher m({"bc", "ab"});
  CHECK(m.push("xabc") == "x");
  CHECK(m.matched() == "ab");
  StopMatcher none({});
  CHECK(none.push("anything") == "anything");
}
