"""Writes conversations_random.json: 60 seeded random conversations for test_template_jinja2 (run from the
repository root: python3 tests/data/templates/gen_random_conversations.py)."""
import json, random
random.seed(7)
base=json.load(open('tests/data/templates/conversations.json'))
tools=base[5]["tools"]
def content():
    r=random.random()
    if r<0.6: return random.choice(["hi","", " x ", "Line1\nLine2", "<think>t</think>a", "ünï 日本", "{\"a\": 1}", "<tool_response>r</tool_response>"])
    if r<0.8: return [{"type":"text","text":random.choice(["a","b c",""])}] + ([{"type":"image"}] if random.random()<0.3 else [])
    if r<0.9: return None
    return random.choice([{"k":"v"}, 5, ["x"]])
def msg():
    role=random.choice(["system","user","assistant","tool","user","assistant","developer"])
    m={"role":role}
    if random.random()<0.9: m["content"]=content()
    if role=="assistant" and random.random()<0.4:
        m["tool_calls"]=[{"id":random.choice(["abc123XYZ","call_1","x"]),"type":"function","function":{"name":random.choice(["get_weather","search"]),"arguments":random.choice([{"location":"Paris"},"{\"q\": 1}",{}])}} for _ in range(random.randint(1,2))]
    if role=="assistant" and random.random()<0.3: m["reasoning_content"]=random.choice(["r","", "multi\nline"])
    if role=="tool": m["tool_call_id"]=random.choice(["abc123XYZ","call_1"]); m["name"]="get_weather"
    return m
cases=[]
for i in range(60):
    n=random.randint(0,5)
    cases.append({"name":f"rand{i}","messages":[msg() for _ in range(n)],"tools":tools if random.random()<0.4 else None,
      "add_generation_prompt":random.random()<0.7,"kwargs":random.choice([{},{"enable_thinking":True},{"enable_thinking":False},{"reasoning_effort":"high","thinking":True}]),"bos_token":"<s>","eos_token":"</s>"})
json.dump(cases, open('tests/data/templates/conversations_random.json', 'w'), indent=0, ensure_ascii=False)
