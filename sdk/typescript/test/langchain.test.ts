/**
 * mentis-sandbox/langchain: LangChain agent loops on real sandboxes. No model service: a scripted chat model
 * (@langchain/core's fake model, which takes tool calls and binds tools) emits the tool calls; everything else
 * is real, from LangChain's createAgent loop and its ToolNode to the sandbox's shell, kernel and files.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { AIMessage, type BaseMessage, HumanMessage, ToolMessage } from "@langchain/core/messages";
import { FakeBuiltModel } from "@langchain/core/testing";
import type { StructuredTool } from "@langchain/core/tools";
import { convertToOpenAITool } from "@langchain/core/utils/function_calling";
import { createAgent } from "langchain";
import { Sandbox } from "mentis-sandbox";
import { sandboxTools } from "mentis-sandbox/langchain";
import { runtime } from "./harness.js";

const NAMES = ["run_shell", "run_python", "read_file", "write_file", "list_files"];

type OpenAITool = ReturnType<typeof convertToOpenAITool>;

/** The scripted model; binding tools (createAgent binds them for each model call) also records their schemas
 * as a provider would get them (OpenAI's function format). */
class ScriptedModel extends FakeBuiltModel {
  readonly bindings: OpenAITool[][] = [];

  override bindTools(tools: Parameters<FakeBuiltModel["bindTools"]>[0]): ReturnType<FakeBuiltModel["bindTools"]> {
    this.bindings.push(tools.map((t) => convertToOpenAITool(t as StructuredTool)));
    return super.bindTools(tools);
  }
}

/** A tool call of a model's turn. */
function call(name: string, id: string, args: Record<string, unknown>): { name: string; id: string; args: Record<string, unknown> } {
  return { name, id, args };
}

function toolMessages(messages: BaseMessage[]): Map<string, ToolMessage> {
  const found = new Map<string, ToolMessage>();
  for (const m of messages) if (ToolMessage.isInstance(m)) found.set(m.tool_call_id, m);
  return found;
}

test("a createAgent loop runs its tool calls in the sandbox", async () => {
  await runtime();
  await using sb = await Sandbox.create();
  const final = "42 is in answer.txt; doubled, 84; the plan is written.";
  const model = new ScriptedModel()
    .respondWithTools([call("run_shell", "c1", { command: "echo $((6*7)) > answer.txt; cat answer.txt" })])
    .respondWithTools([call("run_python", "c2", { code: "n = int(open('answer.txt').read())\nn * 2" })])
    .respondWithTools([call("write_file", "c3", { path: "notes/plan.md", content: "# Plan\nstep one\n" })])
    .respondWithTools([call("read_file", "c4", { path: "notes/plan.md" }), call("list_files", "c5", { path: "notes" })])
    .respondWithTools([call("read_file", "c6", { path: "notes/missing.md" })])
    .respondWithTools([call("run_shell", "c7", { command: "ls notes/missing.md" })])
    .respond(new AIMessage(final));

  const agent = createAgent({ model, tools: sandboxTools(sb) });
  const out = await agent.invoke({ messages: [new HumanMessage("What is 6 times 7, doubled? Keep a plan.")] });

  // The model was offered the five tools at each call, with their arguments' schemas.
  assert.ok(model.bindings.length >= 1);
  for (const bound of model.bindings) assert.deepEqual(bound.map((t) => t.function.name), NAMES);
  const shell = model.bindings[0]?.[0]?.function.parameters as { required?: string[]; properties?: Record<string, unknown> };
  assert.deepEqual(shell.required, ["command"]);
  assert.deepEqual(Object.keys(shell.properties ?? {}).sort(), ["command", "timeout"]);

  const results = toolMessages(out.messages);
  assert.deepEqual([...results.keys()].sort(), ["c1", "c2", "c3", "c4", "c5", "c6", "c7"]);
  assert.equal(results.get("c1")?.content, "exit code: 0\n--- stdout ---\n42");
  // The kernel sees the file the shell wrote: one sandbox, one workspace.
  assert.equal(results.get("c2")?.content, "status: ok\n--- result ---\n84");
  assert.equal(results.get("c3")?.content, "wrote 16 bytes to notes/plan.md");
  assert.equal(results.get("c4")?.content, "# Plan\nstep one\n");
  assert.equal(results.get("c5")?.content, "notes/plan.md (16 bytes)");
  // A refused call is a ToolMessage with status "error" that the model reads, and the loop goes on.
  assert.equal(results.get("c6")?.status, "error");
  assert.equal(results.get("c6")?.content, 'error: PATH_NOT_FOUND: "notes/missing.md" does not exist');
  assert.equal(results.get("c6")?.name, "read_file");
  // A failing command is an answer with its exit code, not an error.
  assert.equal(results.get("c7")?.status, "success");
  assert.match(String(results.get("c7")?.content), /^exit code: 2\n--- stderr ---\nls: cannot access 'notes\/missing.md/);
  for (const id of ["c1", "c2", "c3", "c4", "c5"]) assert.equal(results.get(id)?.status, "success", id);
  assert.equal(out.messages.at(-1)?.content, final);
  assert.equal(out.messages.filter((m) => AIMessage.isInstance(m)).length, 7);
  // Each model turn after the first was sent the tool messages before it.
  assert.equal(model.callCount, 7);
  const lastPrompt = model.calls[6]?.messages ?? [];
  assert.equal(toolMessages(lastPrompt).get("c6")?.content, 'error: PATH_NOT_FOUND: "notes/missing.md" does not exist');

  // And the sandbox holds what the agent did.
  assert.equal(await sb.files.readText("notes/plan.md"), "# Plan\nstep one\n");
  assert.equal((await sb.run("cat answer.txt")).stdout, "42\n");
});

test("a run's signal cancels the running command in the sandbox", async () => {
  await runtime();
  await using sb = await Sandbox.create();
  const model = new ScriptedModel().respondWithTools([call("run_shell", "a1", { command: "sleep 60; touch finished" })]);
  const agent = createAgent({ model, tools: sandboxTools(sb) });
  const controller = new AbortController();
  const started = Date.now();
  setTimeout(() => controller.abort(new Error("the user stopped it")), 1500);
  await assert.rejects(agent.invoke({ messages: [new HumanMessage("go")] }, { signal: controller.signal }));
  assert.ok(Date.now() - started < 30_000, "the agent waited for the command");
  let left = "";
  for (let i = 0; i < 50; i++) {
    // (The pattern does not match this command's own shell.)
    left = (await sb.run("pgrep -f 'slee[p] 60' || true")).stdout;
    if (!left) break;
    await new Promise((r) => setTimeout(r, 100));
  }
  assert.equal(left, "", "the sleep still runs");
});

test("a refused call is the tool's answer: a ToolMessage with status error, or its text", async () => {
  await runtime();
  await using sb = await Sandbox.create();
  const tools = new Map(sandboxTools(sb, { limit: 1000 }).map((t) => [t.name, t]));
  const shell = tools.get("run_shell");
  assert.ok(shell);
  // Invoked with plain arguments: the text.
  assert.equal(await shell.invoke({ command: "echo plain" }), "exit code: 0\n--- stdout ---\nplain");
  assert.equal(
    await tools.get("read_file")?.invoke({ path: "nowhere.txt" }),
    'error: PATH_NOT_FOUND: "nowhere.txt" does not exist',
  );
  // A cut answer, through LangChain as through the AI SDK.
  await sb.files.write("big.txt", "z".repeat(3000));
  assert.equal(
    await tools.get("read_file")?.invoke({ path: "big.txt" }),
    "z".repeat(500) + "\n[... 2,000 characters cut from the middle: the output had 3,000 characters, 1,000 are shown ...]\n" + "z".repeat(500),
  );

  // The sandbox gone: invoked with a tool call, a ToolMessage with status "error".
  await sb.delete();
  const message: unknown = await shell.invoke({ name: "run_shell", args: { command: "echo hi" }, id: "g1", type: "tool_call" });
  assert.ok(ToolMessage.isInstance(message));
  assert.equal(message.status, "error");
  assert.equal(message.tool_call_id, "g1");
  assert.equal(message.content, `error: SANDBOX_ENDED: sandbox ${sb.id} is TERMINATED; an action needs it RUNNING`);
});

test("only sandboxes make tools", () => {
  assert.throws(() => sandboxTools("sandbox-id" as unknown as Sandbox), /takes a mentis-sandbox Sandbox, not string/);
});
