// Chat templates: the Jinja interpreter on its own, then real model templates
// rendered exactly as Hugging Face transformers renders them.
#include <doctest/doctest.h>

#include <string>
#include <thread>
#include <vector>

#include "test_util.h"
#include "weights/chat_template.h"
#include "weights/gguf.h"
#include "weights/jinja.h"

namespace jinja = llm::weights::jinja;
using llm::weights::ChatMessage;
using llm::weights::ChatTemplate;
using llm::weights::ChatTemplateError;
using nlohmann::json;

namespace {

std::string render(const std::string& source, const json& context = json::object(),
                   const jinja::RenderOptions& options = {}) {
  return jinja::Template(source).render(context, options);
}

// The message of the error rendering `source` throws, or "" if it renders.
template <class E = jinja::Error>
std::string error_of(const std::string& source, const json& context = json::object(),
                     const jinja::RenderOptions& options = {}) {
  try {
    render(source, context, options);
  } catch (const E& e) {
    return e.what();
  }
  return "";
}

json conversation() {
  return json::array({{{"role", "system"}, {"content", "You are helpful."}},
                      {{"role", "user"}, {"content", "Hi"}},
                      {{"role", "assistant"}, {"content", "Hello!"}},
                      {{"role", "user"}, {"content", "How are you?"}}});
}

json without_system(json messages) {
  messages.erase(messages.begin());
  return messages;
}

std::string qwen_template_source() {
  const auto config =
      json::parse(llm::test::read_file(llm::test::model_path("qwen2-tokenizer/tokenizer_config.json")));
  return config.at("chat_template").get<std::string>();
}

}  // namespace

TEST_SUITE("jinja") {

TEST_CASE("expressions follow Python semantics") {
  CHECK(render("{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 2 ** 10 }}") == "7 9 1024");
  // "/" is true division; "//" and "%" round toward negative infinity.
  CHECK(render("{{ 7 / 2 }} {{ 4 / 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7.5 // 2 }}") ==
        "3.5 2.0 3 -4 2 3.0");
  // Floats print as Python's repr: shortest round trip, exponent past 1e16.
  CHECK(render("{{ 0.1 + 0.2 }} {{ 1.0 }} {{ 1e16 }} {{ 1e15 }} {{ 1e-5 }}") ==
        "0.30000000000000004 1.0 1e+16 1000000000000000.0 1e-05");
  CHECK(render("{{ 'a' ~ 1 ~ none }} {{ 'a' + 'b' }} {{ 'ab' * 2 }} {{ [1] + [2] }}") == "a1None ab abab [1, 2]");
  CHECK(render("{{ 1 == 1.0 }} {{ true == 1 }} {{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ 'a' != 'b' }}") ==
        "True True True False True");
  CHECK(render("{{ 'x' in 'xyz' }} {{ 2 in [1, 2] }} {{ 'k' in {'k': 1} }} {{ 'q' not in 'abc' }}") ==
        "True True True True");
  CHECK(render("{{ 0 or 'b' }} {{ 'a' and 'b' }} {{ not [] }} {{ 'y' if [] else 'n' }} {{ 'y' if {'k': 0} else "
               "'n' }}") == "b b True n y");
  CHECK(render("{{ 'a' if false else 'b' if true else 'c' }}|{{ 'x' if false }}|") == "b||");
  CHECK(render("{{ -1|abs }} {{ -2 ** 2 }}") == "1 4");  // unary minus binds tighter than ** in Jinja
}

TEST_CASE("literals print as Python's str()") {
  CHECK(render("{{ [1, 'a', none, true, 2.5, {'k': 'v'}] }}") == "[1, 'a', None, True, 2.5, {'k': 'v'}]");
  CHECK(render("{{ (1, 2) }} {{ (1,) }} {{ none }} {{ False }} {{ [\"it's\"] }}") ==
        "(1, 2) (1,) None False [\"it's\"]");
  CHECK(render(R"({{ 'tab\there \u00e9 \x41 \'q\' "d" \\ \n' }})") == "tab\there \xc3\xa9 A 'q' \"d\" \\ \n");
  CHECK(render("{{ 'adjacent' ' strings' }} {{ 1_000 }} {{ [1, 2,] }}") == "adjacent strings 1000 [1, 2]");
}

TEST_CASE("whitespace control, trim_blocks and lstrip_blocks") {
  // trim_blocks drops the newline after a block tag; lstrip_blocks the indentation before it.
  CHECK(render("<ul>\n  {% for i in [1, 2] %}\n  <li>{{ i }}</li>\n  {% endfor %}\n</ul>") ==
        "<ul>\n  <li>1</li>\n  <li>2</li>\n</ul>");
  // Neither applies to {{ }}; "-" strips all whitespace on its side, newlines included.
  CHECK(render("a\n  {{ 'b' }}\nc") == "a\n  b\nc");
  CHECK(render("a  \n  {{- 'b' -}}  \n  c") == "abc");
  CHECK(render("{% if true -%}\n\n  x  \n\n{%- endif %}") == "x");
  // "+" turns both off for one tag.
  CHECK(render("  {%+ if true %}\nx{% endif +%}\ny") == "  x\ny");
  CHECK(render("  {% if true %} x {% endif %}  \ny") == " x   \ny");  // only a tag that starts a line is lstripped
  // Comments take part like blocks and render nothing.
  CHECK(render("a\n  {# note #}\nb{#- gone -#}  c") == "a\nbc");
  CHECK(render("{# multi\nline #}x") == "x");
  // raw keeps its body verbatim.
  CHECK(render("{% raw %}{{ not evaluated }} {% if %}{% endraw %}") == "{{ not evaluated }} {% if %}");
  CHECK(render("a\n  {%- raw %} {{x}} {% endraw -%}  \n b") == "a {{x}} b");
  // Newlines are normalized and one trailing newline dropped, as Jinja's defaults do.
  CHECK(render("{% if true %}\r\nwin\r\n{% endif %}\r\n") == "win\n");
  CHECK(render("line\n\n") == "line\n");
}

TEST_CASE("for loops: loop variables, unpacking, filters, else, break and continue") {
  CHECK(
      render(
          "{% for x in ['a', 'b', 'c'] %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}"
          "{{ loop.first }}{{ loop.last }}{{ loop.length }} {% endfor %}") ==
      "1032TrueFalse3 2121FalseFalse3 3210FalseTrue3 ");
  CHECK(render("{% for x in [1, 2, 3] %}{{ loop.previtem|default('-') }}{{ loop.nextitem|default('-') }} {% "
               "endfor %}") == "-2 13 2- ");
  CHECK(render("{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }};{% endfor %}") == "a=1;b=2;");
  // The inline filter runs before the loop variables are computed.
  CHECK(render("{% for m in messages if m.role != 'system' %}{{ loop.index }}/{{ loop.length }} {{ m.role }};{% "
               "endfor %}",
               {{"messages", conversation()}}) == "1/3 user;2/3 assistant;3/3 user;");
  CHECK(render("{% for x in [] %}x{% else %}empty{% endfor %}|{% for x in [1] if false %}x{% else %}none{% endfor "
               "%}") == "empty|none");
  CHECK(render("{% for i in range(10) %}{% if i == 4 %}{% break %}{% endif %}{% if i is odd %}{% continue %}{% "
               "endif %}{{ i }}{% endfor %}") == "02");
  CHECK(render(
            "{% for c in 'h\xc3\xa9' %}[{{ c }}]{% endfor %}{% for k in {'b': 1, 'a': 2} %}{{ k }}{% endfor %}") ==
        "[h][\xc3\xa9]ba");  // dicts iterate in insertion order
  // Iterating an undefined value is empty; a number is an error.
  CHECK(render("{% for x in missing %}x{% endfor %}.") == ".");
  CHECK(error_of("{% for x in 5 %}{% endfor %}").find("'int' object is not iterable") != std::string::npos);
}

TEST_CASE("assignments are scoped like Jinja's, namespaces carry state out of loops") {
  CHECK(render("{% set x = 1 %}{% for i in [1, 2] %}{% set x = x + 1 %}{{ x }}{% endfor %}{{ x }}") == "221");
  CHECK(render(
            "{% set ns = namespace(count=0, seen='') %}{% for m in messages %}{% if m.role == 'user' %}"
            "{% set ns.count = ns.count + 1 %}{% set ns.seen = ns.seen ~ m.content ~ ';' %}{% endif %}{% endfor %}"
            "{{ ns.count }} {{ ns.seen }}",
            {{"messages", conversation()}}) == "2 Hi;How are you?;");
  CHECK(render("{% set a, b = 1, 2 %}{{ a }}{{ b }}") == "12");
  CHECK(render("{% set block %}x={{ 1 + 1 }}{% endset %}[{{ block }}]") == "[x=2]");
  CHECK(error_of("{% set s = 'str' %}{% set s.attr = 1 %}").find("not a namespace") != std::string::npos);
}

TEST_CASE("filters") {
  CHECK(render("[{{ '  hi  '|trim }}] [{{ 'xxhixx'|trim('x') }}] {{ 'Hello'|length }} {{ [1, 2]|count }} {{ {'a': "
               "1}|length }}") == "[hi] [hi] 5 2 1");
  CHECK(render("{{ 'h\xc3\xa9llo'|length }} {{ 'h\xc3\xa9llo'|upper }} {{ 'HeLLo'|lower }}") ==
        "5 H\xc3\x89LLO hello");
  CHECK(render("{{ 'hello world'|title }} {{ \"they're\"|title }} {{ 'hELLO wORLD'|capitalize }}") ==
        "Hello World They're Hello world");
  CHECK(render("{{ 1|string ~ 'x' }} {{ '42'|int + 1 }} {{ '4.7'|int }} {{ 'x'|int }} {{ 'x'|int(-1) }} {{ "
               "3.9|int }} {{ '2.5'|float }} {{ 3|float }}") == "1x 43 4 0 -1 3 2.5 3.0");
  CHECK(render("{{ ['a', 'b']|join(', ') }} {{ [1, 2]|join }} {{ messages|join('/', attribute='role') }}",
               {{"messages", conversation()}}) == "a, b 12 system/user/assistant/user");
  CHECK(render("{{ missing|default('d') }} {{ ''|default('d') }} {{ ''|default('d', true) }} {{ none|d('d') }}") ==
        "d  d None");
  CHECK(render("{{ [3, 1, 2]|first }} {{ [3, 1, 2]|last }} {{ 'abc'|first }} {{ 'abc'|list }} {{ {'k': "
               "1}|items|list }}") == "3 2 a ['a', 'b', 'c'] [('k', 1)]");
  CHECK(render("{{ 'a-b-c'|replace('-', '+') }} {{ 'aaa'|replace('a', 'b', 2) }} {{ 'abc'|reverse }} {{ [1, "
               "2]|reverse|list }}") == "a+b+c bba cba [2, 1]");
  CHECK(render("{{ messages|selectattr('role', 'equalto', 'user')|map(attribute='content')|list }}",
               {{"messages", conversation()}}) == "['Hi', 'How are you?']");
  CHECK(render("{{ messages|rejectattr('role', 'in', ['user', 'system'])|map(attribute='role')|join }}",
               {{"messages", conversation()}}) == "assistant");
  CHECK(render("{{ ['a', 'b']|map('upper')|join }} {{ [1, 2, 3]|select('odd')|list }} {{ "
               "none|selectattr('x')|list }}") == "AB [1, 3] []");
  CHECK(
      render(
          "{{ 'a\\nb\\n\\nc'|indent(2) }}|{{ 'a\\nb'|indent(2, true) }}|{{ 'a\\n\\nb'|indent(2, blank=true) }}") ==
      "a\n  b\n\n  c|  a\n  b|a\n  \n  b");
  CHECK(render("{{ -2.5|abs }} {{ 2.5|round }} {{ 3.5|round }} {{ 2.675|round(2) }} {{ 3|round }} {{ "
               "2.1|round(method='ceil') }}") == "2.5 2.0 4.0 2.67 3 3.0");
  CHECK(render("{{ '<b>'|safe }}") == "<b>");
}

TEST_CASE("tojson matches Python's json.dumps") {
  const json data =
      json::parse(R"({"name": "caf\u00e9", "n": [1, 2.5, true, null], "nested": {"q": "say \"hi\"\n"}})");
  CHECK(render("{{ data|tojson }}", {{"data", data}}) ==
        R"({"n": [1, 2.5, true, null], "name": "café", "nested": {"q": "say \"hi\"\n"}})");
  CHECK(render("{{ data.n|tojson(indent=2) }}", {{"data", data}}) == "[\n  1,\n  2.5,\n  true,\n  null\n]");
  CHECK(render("{{ {'b': [], 'a': {}}|tojson(indent=4, sort_keys=true) }}") ==
        "{\n    \"a\": {},\n    \"b\": []\n}");
  CHECK(render("{{ 'caf\xc3\xa9'|tojson(ensure_ascii=true) }} {{ [1, 2]|tojson(separators=[',', ':']) }}") ==
        "\"caf\\u00e9\" [1,2]");
  // transformers' tojson takes ensure_ascii first, so a bare positional flag is ensure_ascii, not indent.
  CHECK(render("{{ ['\xc3\xa9']|tojson(true) }}") == "[\"\\u00e9\"]");
  // Key order is the order of the input: ordered_json keeps it, as Python dicts do.
  const auto ordered = nlohmann::ordered_json::parse(R"({"data": {"z": 1, "a": 2}})");
  CHECK(jinja::Template("{{ data|tojson }} {{ {'z': 1, 'a': 2}|tojson }}").render(ordered) ==
        R"({"z": 1, "a": 2} {"z": 1, "a": 2})");
  CHECK(error_of("{{ missing|tojson }}").find("not JSON serializable") != std::string::npos);
}

TEST_CASE("tests") {
  CHECK(render("{{ x is defined }} {{ y is defined }} {{ y is undefined }} {{ x is none }} {{ n is none }}",
               {{"x", 1}, {"n", nullptr}}) == "True False True False True");
  CHECK(render("{{ 's' is string }} {{ 1 is string }} {{ 1 is number }} {{ 1.5 is number }} {{ 1 is integer }} {{ "
               "1.0 is integer }}") == "True False True True True False");
  CHECK(render("{{ {} is mapping }} {{ [] is mapping }} {{ [] is iterable }} {{ 's' is iterable }} {{ 1 is "
               "iterable }} {{ [] is sequence }}") == "True False True True False True");
  CHECK(
      render("{{ true is boolean }} {{ 1 is boolean }} {{ true is true }} {{ 1 is true }} {{ false is false }}") ==
      "True False True False True");
  CHECK(render("{{ 1 is equalto 1 }} {{ 'a' is eq 'b' }} {{ 2 is ne 3 }} {{ 3 is odd }} {{ 4 is even }} {{ 2 is "
               "in [1, 2] }}") == "True False True True True True");
  CHECK(render("{{ x is not defined }} {{ 2 is not odd }} {{ 1 is not odd }}") == "True True False");
}

TEST_CASE("slicing and subscripts") {
  CHECK(render("{{ messages[1:]|map(attribute='role')|list }}", {{"messages", conversation()}}) ==
        "['user', 'assistant', 'user']");
  CHECK(render("{{ [1, 2, 3, 4][::-1] }} {{ [1, 2, 3, 4][1::2] }} {{ [1, 2, 3][-2:] }} {{ [1, 2, 3][:-1] }} {{ "
               "[1, 2][5:] }}") == "[4, 3, 2, 1] [2, 4] [2, 3] [1, 2] []");
  CHECK(render("{{ 'h\xc3\xa9llo'[1] }} {{ 'h\xc3\xa9llo'[1:3] }} {{ 'abc'[::-1] }} {{ 'abc'[-1] }}") ==
        "\xc3\xa9 \xc3\xa9l cba c");
  CHECK(render("{{ messages[0]['role'] }} {{ messages[0].role }} {{ messages[-1].content }} {{ [[1, 2]].0.1 }}",
               {{"messages", conversation()}}) == "system system How are you? 2");
  CHECK(error_of("{{ [1][::0] }}").find("slice step cannot be zero") != std::string::npos);
}

TEST_CASE("undefined values render empty, are falsy, and fail when used as objects") {
  CHECK(render("[{{ missing }}] [{{ d.nope }}] [{{ d['nope'] }}] [{{ l[9] }}] {{ 'y' if missing else 'n' }}",
               {{"d", json::object()}, {"l", json::array()}}) == "[] [] [] [] n");
  CHECK(render("{{ n.attr is defined }} {{ n is none }}", {{"n", nullptr}}) ==
        "False True");  // none is not undefined
  CHECK(render("{{ missing|length }} {{ missing|default(1) + 1 }}") == "0 2");
  CHECK(error_of("{{ missing.attr }}").find("'missing' is undefined") != std::string::npos);
  CHECK(error_of("{{ missing + 1 }}").find("'missing' is undefined") != std::string::npos);
  CHECK(error_of("{{ missing() }}").find("'missing' is undefined") != std::string::npos);
  CHECK(error_of("{{ d.a.b }}", {{"d", json::object()}}).find("has no attribute 'a'") != std::string::npos);
}

TEST_CASE("macros: defaults, keywords, recursion") {
  CHECK(render("{% macro tag(name, cls='x') %}<{{ name }} {{ cls }}>{% endmacro %}{{ tag('a') }}{{ tag('b', "
               "cls='y') }}{{ tag(cls='z', name='c') }}") == "<a x><b y><c z>");
  CHECK(
      render(
          "{% macro count(n) %}{% if n > 0 %}{{ n }}{{ count(n - 1) }}{% endif %}{% endmacro %}{{ count(3) }}") ==
      "321");
  CHECK(render("{% for i in [2] %}{% macro down(n) %}{{ n }}{% if n %}{{ down(n - 1) }}{% endif %}{% endmacro "
               "%}{{ down(i) }}{% endfor %}") == "210");
  CHECK(render("{% macro m() %}{{ varargs }}{{ kwargs }}{% endmacro %}{{ m(1, k=2) }}") == "(1,){'k': 2}");
  // Macros see the template's top-level variables, not the caller's loop variables.
  CHECK(render("{% set who = 'top' %}{% macro m() %}{{ who }}{% endmacro %}{% for who in ['loop'] %}{{ m() }}{% "
               "endfor %}") == "top");
  CHECK(render("{% macro greet() %}hi{% endmacro %}{{ greet() ~ '!' }} {{ greet is defined }}") == "hi! True");
}

TEST_CASE("string and dict methods") {
  CHECK(
      render(
          "[{{ '  a  '.strip() }}] [{{ 'xxaxx'.strip('x') }}] [{{ '  a'.lstrip() }}] [{{ 'a..'.rstrip('.') }}]") ==
      "[a] [a] [a] [a]");
  CHECK(render("{{ 'a,b,,c'.split(',') }} {{ ' a  b '.split() }} {{ 'a b c'.split(' ', 1) }}") ==
        "['a', 'b', '', 'c'] ['a', 'b'] ['a', 'b c']");
  CHECK(render("{{ 'abc'.startswith('ab') }} {{ 'abc'.endswith(('x', 'c')) }} {{ 'abc'.upper() }} {{ "
               "'ABC'.lower() }} {{ \"they're\".title() }}") == "True True ABC abc They'Re");
  CHECK(render("{{ 'a-b-c'.replace('-', '') }} {{ ', '.join(['x', 'y']) }}") == "abc x, y");
  CHECK(render("{{ '<think>r</think>answer'.split('</think>')[-1] }}") == "answer");
  CHECK(render("{{ d.get('a') }} {{ d.get('z') }} {{ d.get('z', 0) }} {{ d.keys()|list }} {{ d.values()|list }} "
               "{{ d.items()|list }}",
               {{"d", {{"a", 1}}}}) == "1 None 0 ['a'] [1] [('a', 1)]");
}

TEST_CASE("globals: range, dict, namespace, raise_exception, strftime_now") {
  CHECK(render("{{ range(3)|list }} {{ range(1, 10, 4)|list }} {{ range(3, 0, -1)|list }}") ==
        "[0, 1, 2] [1, 5, 9] [3, 2, 1]");
  CHECK(render("{{ dict(a=1).a }} {{ namespace(x=1).x }}") == "1 1");
  try {
    render("line one\n{{ raise_exception('Roles must alternate') }}");
    FAIL("raise_exception did not throw");
  } catch (const jinja::RaisedError& e) {
    CHECK(std::string(e.what()) == "Roles must alternate");
    CHECK(e.line() == 2);
  }
  jinja::RenderOptions options;
  options.now = 1700000000;  // 2023-11-14 22:13 UTC: the same year in every time zone
  CHECK(render("{{ strftime_now('%Y') }}", json::object(), options) == "2023");
  CHECK(render("{{ strftime_now('%d %b %Y')|length }}") == "11");  // the real clock, e.g. "26 Jul 2024"
  CHECK(render("{% generation %}kept {{ 1 }}{% endgeneration %}") == "kept 1");
}

TEST_CASE("syntax errors name the line and column") {
  auto syntax_error = [](const std::string& source) {
    try {
      jinja::Template t(source);
    } catch (const jinja::SyntaxError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  CHECK(syntax_error("ok\n{{ 1 + }}") == "line 2, column 8: expected an expression, got '}}'");
  CHECK(syntax_error("{% if x %}\nno end") == "line 1, column 4: 'if' block is never closed (expected 'endif')");
  CHECK(syntax_error("{% for x in y %}{% endif %}") == "line 1, column 20: unexpected 'endif', expected 'endfor'");
  CHECK(syntax_error("a\n  {% frobnicate %}") == "line 2, column 6: unknown tag 'frobnicate'");
  CHECK(syntax_error("{% extends 'base.html' %}") == "line 1, column 4: 'extends' tags are not supported");
  CHECK(syntax_error("{% break %}") == "line 1, column 4: 'break' outside of a for loop");
  CHECK(syntax_error("{{ 'open }}") == "line 1, column 4: unterminated string literal");
  CHECK(syntax_error("{{ (1 }}") == "line 1, column 7: unexpected '}', expected ')'");
  CHECK(syntax_error("{{ x ") == "line 1, column 1: missing '}}' to close this tag");
  CHECK(syntax_error("{{ x }") == "line 1, column 6: unexpected '}'");
  CHECK(syntax_error("{# never closed") == "line 1, column 1: missing end of comment tag '#}'");
  CHECK(syntax_error("{% for x in y recursive %}{% endfor %}") ==
        "line 1, column 15: recursive loops are not supported");
  CHECK(syntax_error("{{ x @ y }}") == "line 1, column 6: unexpected character '@'");
}

TEST_CASE("runtime errors name the line and the problem") {
  const std::string unknown_filter = error_of<jinja::RenderError>("a\nb {{ x|frobnicate }}", {{"x", 1}});
  CHECK(unknown_filter == "line 2, column 8: unknown filter 'frobnicate'");
  // An unknown filter in a branch that never runs is not an error, as in Jinja,
  // but the template reports what it lacks up front.
  const jinja::Template lacking("{% if false %}{{ x|frobnicate }}{{ y is odd }}{{ z is weird }}{% endif %}ok");
  CHECK(lacking.render(json::object()) == "ok");
  CHECK(lacking.unknown_names() == std::vector<std::string>{"filter 'frobnicate'", "test 'weird'"});
  CHECK(jinja::Template("{{ x|trim|tojson }}").unknown_names().empty());
  CHECK(error_of("{{ x is frobnicated }}").find("unknown test 'frobnicated'") != std::string::npos);
  CHECK(error_of("{{ 'a' + 1 }}") == "line 1, column 8: unsupported operand type(s) for +: 'str' and 'int'");
  CHECK(error_of("{{ 1 // 0 }}").find("by zero") != std::string::npos);
  CHECK(error_of("{{ '%d' % 1 }}").find("not supported") != std::string::npos);
  CHECK(error_of("{{ 'abc'.frobnicate() }}").find("'str object' has no attribute 'frobnicate'") !=
        std::string::npos);
  CHECK_THROWS_AS(jinja::Template("x").render(json::array()), jinja::RenderError);
}

TEST_CASE("pathological templates hit limits instead of exhausting the server") {
  // Parser nesting.
  CHECK_THROWS_AS(jinja::Template("{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}"),
                  jinja::SyntaxError);
  CHECK_THROWS_AS(jinja::Template("{{ " + std::string(5000, '[') + std::string(5000, ']') + " }}"),
                  jinja::SyntaxError);
  std::string nots, conditionals = "{{ 1";
  for (int i = 0; i < 5000; ++i) {
    nots += "not ";
    conditionals += " if 1 else 1";
  }
  CHECK_THROWS_AS(jinja::Template("{{ " + nots + "1 }}"), jinja::SyntaxError);
  CHECK_THROWS_AS(jinja::Template(conditionals + " }}"), jinja::SyntaxError);
  CHECK_THROWS_AS(jinja::Template("{{ " + std::string(100000, '-') + "1 }}"), jinja::SyntaxError);
  std::string long_sum = "{{ 1";
  for (int i = 0; i < 100000; ++i) long_sum += " + 1";
  CHECK_THROWS_AS(jinja::Template(long_sum + " }}"), jinja::SyntaxError);
  std::string deep_blocks;
  for (int i = 0; i < 1000; ++i) deep_blocks += "{% if true %}";
  CHECK_THROWS_AS(jinja::Template{deep_blocks}, jinja::SyntaxError);
  // Work, output, recursion and sizes at render time.
  jinja::RenderOptions small;
  small.max_steps = 10000;
  small.max_output_bytes = size_t{1} << 20;
  CHECK(error_of("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
                 json::object(), small)
            .find("exceeded 10000 steps") != std::string::npos);
  CHECK(error_of("{{ range(1000000000)|length }}").find("range()") != std::string::npos);
  CHECK(error_of("{{ 'x' * 1000000000 }}").find("limit") != std::string::npos);
  CHECK(
      error_of("{% set ns = namespace(s='xx') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}")
          .find("limit") != std::string::npos);
  CHECK(error_of("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}").find("recursion") != std::string::npos);
  CHECK(error_of("{% set ns = namespace() %}{% set ns.self = ns %}{{ ns }}").find("too deeply") !=
        std::string::npos);
  // Values cannot nest without bound, whatever holds them: lists, loop objects, bound methods.
  CHECK(error_of("{% set ns = namespace(l=[]) %}{% for i in range(1000) %}{% set ns.l = [ns.l] %}{% endfor %}")
            .find("nested deeper") != std::string::npos);
  CHECK(error_of("{% set ns = namespace(v=0) %}{% for i in range(1000) %}{% for x in [ns.v, 0] %}"
                 "{% if loop.last %}{% set ns.v = loop %}{% endif %}{% endfor %}{% endfor %}")
            .find("nested deeper") != std::string::npos);
  CHECK(error_of(
            "{% set ns = namespace(v={}) %}{% for i in range(1000) %}{% set ns.v = {'k': ns.v}.get %}{% endfor %}")
            .find("nested deeper") != std::string::npos);
  json context = json::object();
  json* deep = &context["d"];
  for (int i = 0; i < 1000; ++i) deep = &(*deep)["k"];
  CHECK_THROWS_WITH_AS(render("{{ d }}", context), doctest::Contains("nested deeper"), jinja::RenderError);
  // Amplifying filters stop at the size limit instead of first allocating the result.
  for (const char* amplifier : {"{{ ['x' * 1000] * 100000 }}", "{{ [1]|tojson(indent=1000000000) }}",
                                "{{ [[[1]]]|tojson(indent='x' * 300000) }}",
                                "{{ ('a' * 100000)|replace('a', 'x' * 10000) }}",
                                "{{ ('a\\n' * 100000)|indent(10000) }}"}) {
    CHECK_MESSAGE(error_of(amplifier, json::object(), small).find("limit of 1048576 bytes") != std::string::npos,
                  amplifier);
  }
  small.max_output_bytes = 10;
  CHECK(error_of("{% for i in range(20) %}x{% endfor %}", json::object(), small).find("limit of 10 bytes") !=
        std::string::npos);
}

}  // TEST_SUITE("jinja")

TEST_SUITE("chat_template") {

TEST_CASE("Qwen2.5's template renders a multi-turn conversation exactly") {
  const auto t = ChatTemplate::from_hf_dir(llm::test::model_path("qwen2-tokenizer"), "", "<|im_end|>");
  CHECK_FALSE(t.is_fallback());
  CHECK(t.source() == qwen_template_source());
  CHECK(t.render(conversation(), true) ==
        "<|im_start|>system\nYou are helpful.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello!<|im_end|>\n"
        "<|im_start|>user\nHow are you?<|im_end|>\n"
        "<|im_start|>assistant\n");
  // Without a system message the template supplies Qwen's default one.
  CHECK(t.render(without_system(conversation()), false) ==
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello!<|im_end|>\n"
        "<|im_start|>user\nHow are you?<|im_end|>\n");
  const std::vector<ChatMessage> plain = {{"user", "Hi"}};
  CHECK(t.render(plain, true) ==
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
}

TEST_CASE("Qwen2.5's template renders tools, tool calls and tool results") {
  const auto t = ChatTemplate::from_hf_dir(llm::test::model_path("qwen2-tokenizer"), "", "<|im_end|>");
  const json tools = json::parse(R"([{"type": "function", "function": {"name": "get_weather",
      "description": "Get the weather", "parameters": {"type": "object",
      "properties": {"city": {"type": "string"}}, "required": ["city"]}}}])");
  const json messages = json::parse(R"([
      {"role": "user", "content": "Weather in Paris?"},
      {"role": "assistant", "content": "", "tool_calls": [{"type": "function",
          "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
      {"role": "tool", "content": "22C"},
      {"role": "assistant", "content": "It is 22C."}])");
  const std::string out = t.render(messages, false, {{"tools", tools}});
  CHECK(out.starts_with(
      "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.\n\n"
      "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"));
  // Each tool as json.dumps prints it (nlohmann::json objects iterate in sorted key order).
  CHECK(out.find("<tools>\n{\"function\": {\"description\": \"Get the weather\", \"name\": \"get_weather\", "
                 "\"parameters\": {\"properties\": {\"city\": {\"type\": \"string\"}}, \"required\": [\"city\"], "
                 "\"type\": \"object\"}}, \"type\": \"function\"}\n</tools>") != std::string::npos);
  CHECK(
      out.find(
          "<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n"
          "</tool_call><|im_end|>\n") != std::string::npos);
  CHECK(out.ends_with("<|im_start|>user\n<tool_response>\n22C\n</tool_response><|im_end|>\n"
                      "<|im_start|>assistant\nIt is 22C.<|im_end|>\n"));
}

TEST_CASE("one template renders concurrently") {
  const auto t = ChatTemplate::from_hf_dir(llm::test::model_path("qwen2-tokenizer"), "", "<|im_end|>");
  const std::string expected = t.render(conversation(), true);
  std::vector<std::string> results(4);
  std::vector<std::thread> threads;
  for (auto& result : results) {
    threads.emplace_back([&] {
      for (int i = 0; i < 50; ++i) result = t.render(conversation(), true);
    });
  }
  for (auto& thread : threads) thread.join();
  for (const auto& result : results) CHECK(result == expected);
}

TEST_CASE("the GGUF's template is Qwen's and renders identically") {
  const llm::weights::GgufFile gguf(llm::test::model_path("tiny-qwen2/tiny-qwen2-f32.gguf"));
  const auto from_gguf = ChatTemplate::from_gguf(gguf, "", "<|im_end|>");
  const auto from_hf = ChatTemplate::from_hf_dir(llm::test::model_path("qwen2-tokenizer"), "", "<|im_end|>");
  CHECK_FALSE(from_gguf.is_fallback());
  CHECK(from_gguf.source() == from_hf.source());
  CHECK(from_gguf.render(conversation(), true) == from_hf.render(conversation(), true));

  const llm::weights::GgufFile no_template(llm::test::model_path("stories260K/stories260K-f32.gguf"));
  CHECK(ChatTemplate::from_gguf(no_template, "<s>", "</s>").is_fallback());
}

TEST_CASE("Llama 2's [INST] template") {
  const ChatTemplate t(
      "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = "
      "messages[0]['content'] %}"
      "{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif %}"
      "{% for message in loop_messages %}"
      "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
      "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
      "{% if loop.index0 == 0 and system_message != false %}"
      "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
      "{% else %}{% set content = message['content'] %}{% endif %}"
      "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
      "{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}"
      "{% endfor %}",
      "<s>", "</s>");
  CHECK(t.render(conversation(), true) ==
        "<s>[INST] <<SYS>>\nYou are helpful.\n<</SYS>>\n\nHi [/INST] Hello! </s><s>[INST] How are you? [/INST]");
  CHECK(t.render(json::array({{{"role", "user"}, {"content", "  padded  "}}}), true) ==
        "<s>[INST] padded [/INST]");
}

TEST_CASE("Llama 3's header template") {
  const ChatTemplate t(
      "{% set loop_messages = messages %}{% for message in loop_messages %}"
      "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | "
      "trim + '<|eot_id|>' %}"
      "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
      "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}",
      "<|begin_of_text|>", "<|eot_id|>");
  CHECK(t.render(conversation(), true) ==
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are helpful.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHow are you?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST_CASE("a generic ChatML template") {
  const ChatTemplate t(
      "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' "
      "+ '\n'}}{% endfor %}"
      "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}",
      "", "<|im_end|>");
  CHECK(t.render(conversation(), false) ==
        "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nHow are you?<|im_end|>\n");
}

TEST_CASE("Mistral's template, and its raise_exception on bad alternation") {
  const ChatTemplate t(
      "{{ bos_token }}{% for message in messages %}"
      "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
      "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
      "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
      "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}"
      "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}",
      "<s>", "</s>");
  CHECK(t.render(without_system(conversation()), true) ==
        "<s>[INST] Hi [/INST]Hello!</s>[INST] How are you? [/INST]");
  const json two_users = json::array({{{"role", "user"}, {"content", "a"}}, {{"role", "user"}, {"content", "b"}}});
  CHECK_THROWS_WITH_AS(t.render(two_users, true),
                       "Conversation roles must alternate user/assistant/user/assistant/...", ChatTemplateError);
  const json tool_turn = json::array({{{"role", "user"}, {"content", "a"}}, {{"role", "tool"}, {"content", "b"}}});
  CHECK_THROWS_WITH_AS(t.render(tool_turn, true), "Only user and assistant roles are supported!",
                       ChatTemplateError);
}

TEST_CASE("models without a template get the documented fallback") {
  const auto t = ChatTemplate::from_hf_dir(llm::test::model_path("stories260K"), "<s>", "</s>");
  CHECK(t.is_fallback());
  CHECK(t.render(conversation(), true) ==
        "system: You are helpful.\nuser: Hi\nassistant: Hello!\nuser: How are you?\nassistant:");
  CHECK(ChatTemplate::fallback().render(json::array({{{"role", "user"}, {"content", "x"}}}), false) ==
        "user: x\n");
  CHECK(ChatTemplate::fallback().render(json::array({{{"role", "assistant"}, {"content", nullptr}}}), false) ==
        "assistant: \n");
}

TEST_CASE("the context is what transformers passes to the template") {
  const ChatTemplate t(
      "{{ tools is none }} {{ documents is none }} {{ bos_token }} {{ eos_token is defined }} {{ extra_var }} {{ "
      "messages|length }}",
      "<s>", "");
  CHECK(t.render(json::array(), false, {{"extra_var", "x"}}) == "True True <s> False x 0");
  CHECK(t.render(json::array(), false, {{"bos_token", "[B]"}, {"messages", "ignored"}}) ==
        "True True [B] False  0");
  CHECK_THROWS_AS(t.render(json::object(), false), ChatTemplateError);
  CHECK_THROWS_AS(t.render(json::array(), false, json::array()), ChatTemplateError);
  // Runtime failures surface as ChatTemplateError with their location.
  const ChatTemplate bad("ok\n{{ messages[0].content.upper() }}", "", "");
  CHECK_THROWS_WITH_AS(bad.render(json::array(), false), doctest::Contains("line 2"), ChatTemplateError);
}

TEST_CASE("tokenizer_config.json variants") {
  llm::test::TempDir dir;
  auto write_config = [&](const json& config) {
    llm::test::write_file(dir / "tokenizer_config.json", config.dump());
  };

  // A malformed template fails at load, naming the problem and where it is.
  write_config({{"chat_template", "{% for m in messages %}\n{{ m.content }"}});
  CHECK_THROWS_WITH_AS(ChatTemplate::from_hf_dir(dir.path(), "", ""),
                       doctest::Contains("line 2, column 14: unexpected '}'"), ChatTemplateError);
  write_config({{"chat_template", "{% if x %}never closed"}});
  CHECK_THROWS_WITH_AS(ChatTemplate::from_hf_dir(dir.path(), "", ""),
                       doctest::Contains("'if' block is never closed"), ChatTemplateError);

  // Named templates: "default" is the one applied.
  write_config({{"chat_template", json::array({{{"name", "tool_use"}, {"template", "T"}},
                                               {{"name", "default"}, {"template", "D{{ messages|length }}"}}})}});
  CHECK(ChatTemplate::from_hf_dir(dir.path(), "", "").render(json::array(), false) == "D0");
  write_config({{"chat_template", json::array({{{"name", "tool_use"}, {"template", "T"}}})}});
  CHECK_THROWS_WITH_AS(ChatTemplate::from_hf_dir(dir.path(), "", ""),
                       doctest::Contains("no chat template named 'default'"), ChatTemplateError);

  write_config({{"chat_template", 42}});
  CHECK_THROWS_AS(ChatTemplate::from_hf_dir(dir.path(), "", ""), ChatTemplateError);
  llm::test::write_file(dir / "tokenizer_config.json", "{not json");
  CHECK_THROWS_WITH_AS(ChatTemplate::from_hf_dir(dir.path(), "", ""), doctest::Contains("invalid JSON"),
                       ChatTemplateError);

  // No template key: the fallback; a chat_template.jinja beside the config wins over it.
  write_config({{"eos_token", "</s>"}});
  CHECK(ChatTemplate::from_hf_dir(dir.path(), "", "").is_fallback());
  llm::test::write_file(dir / "chat_template.jinja", "J{{ messages|length }}\n");
  CHECK(ChatTemplate::from_hf_dir(dir.path(), "", "").render(json::array(), false) == "J0");
}

}  // TEST_SUITE("chat_template")
