#!/usr/bin/env python3
"""jinja2 oracle for kiln's chat-template tests: renders templates exactly as Hugging Face transformers'
apply_chat_template does (transformers/utils/chat_template_utils.py: _compile_jinja_template and
render_jinja_template), without needing transformers itself.

Usage: template_oracle.py JOB.json OUT.json
JOB: {"now": EPOCH_SECONDS, "templates": [PATH, ...], "conversations": [CASE, ...]}
CASE: {"messages": [...], "tools": [...]|null, "add_generation_prompt": bool, "kwargs": {...},
       "bos_token": str, "eos_token": str}
OUT: [[{"ok": true, "text": STR} | {"ok": false, "error": STR}, ...per case], ...per template]
Snippet mode: JOB {"now": ..., "snippets": [{"source": STR, "vars": {...}}, ...]} -> OUT [RESULT, ...], each
snippet rendered with its variables only (no chat arguments).
strftime_now reads the pinned clock "now" (local time), so kiln and jinja2 see the same date.
"""
import json
import sys
from datetime import datetime

import jinja2
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment


def compile_template(source, now):
    # transformers' AssistantTracker: {% generation %}...{% endgeneration %} renders its body (a CallBlock).
    class AssistantTracker(Extension):
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_generation_support"), [], [], body).set_lineno(lineno)

        @jinja2.pass_eval_context
        def _generation_support(self, context, caller):
            return caller()

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        # transformers overrides jinja2's tojson (which HTML-escapes) with plain json.dumps
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format):
        return datetime.fromtimestamp(now).strftime(format)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[AssistantTracker, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env.from_string(source)


def main():
    job = json.load(open(sys.argv[1], encoding="utf-8"))
    now = job.get("now", 0)
    out = []
    if "snippets" in job:
        for sn in job["snippets"]:
            try:
                out.append({"ok": True, "text": compile_template(sn["source"], now).render(**sn.get("vars", {}))})
            except Exception as e:
                out.append({"ok": False, "error": f"{type(e).__name__}: {e}"})
        with open(sys.argv[2], "w", encoding="utf-8") as f:
            json.dump(out, f, ensure_ascii=False)
        return
    for path in job["templates"]:
        source = open(path, encoding="utf-8", newline="").read()
        results = []
        try:
            tmpl = compile_template(source, now)
        except Exception as e:  # a template jinja2 cannot compile fails every conversation
            results = [{"ok": False, "error": f"{type(e).__name__}: {e}"} for _ in job["conversations"]]
            out.append(results)
            continue
        for case in job["conversations"]:
            kwargs = {"bos_token": case.get("bos_token", ""), "eos_token": case.get("eos_token", "")}
            kwargs.update(case.get("kwargs", {}))
            try:
                text = tmpl.render(messages=case["messages"], tools=case.get("tools"), documents=None,
                                   add_generation_prompt=case.get("add_generation_prompt", True), **kwargs)
                results.append({"ok": True, "text": text})
            except Exception as e:
                results.append({"ok": False, "error": f"{type(e).__name__}: {e}"})
        out.append(results)
    with open(sys.argv[2], "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False)


if __name__ == "__main__":
    main()
