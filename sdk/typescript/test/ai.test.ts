/**
 * mentis-sandbox/ai: AI SDK agent loops on real sandboxes. No model service: a scripted model (the AI SDK's
 * MockLanguageModelV3) emits the tool calls; everything else is real, from generateText's loop to the
 * sandbox's shell, kernel and files.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { generateText, stepCountIs, streamText } from "ai";
import { convertArrayToReadableStream, MockLanguageModelV3 } from "ai/test";
import { Sandbox } from "mentis-sandbox";
import { DEFAULT_LIMIT, SandboxToolError, sandboxTools } from "mentis-sandbox/ai";
import { runtime } from "./harness.js";

type GenerateResult = Awaited<ReturnType<MockLanguageModelV3["doGenerate"]>>;
type CallOptions = MockLanguageModelV3["doGenerateCalls"][number];

const NAMES = ["run_shell", "run_python", "read_file", "write_file", "list_files"];
const USAGE: GenerateResult["usage"] = {
  inputTokens: { total: 10, noCache: 10, cacheRead: undefined, cacheWrite: undefined },
  outputTokens: { total: 5, text: 5, reasoning: undefined },
};

/** A model's turn that asks for these tool calls. */
function turn(...calls: [id: string, name: string, input: Record<string, unknown>][]): GenerateResult {
  return {
    content: calls.map(([toolCallId, toolName, input]) => ({
      type: "tool-call" as const,
      toolCallId,
      toolName,
      input: JSON.stringify(input),
    })),
    finishReason: { unified: "tool-calls", raw: "tool_calls" },
    usage: USAGE,
    warnings: [],
  };
}

/** A model's last turn: its answer. */
function answer(text: string): GenerateResult {
  return {
    content: [{ type: "text", text }],
    finishReason: { unified: "stop", raw: "stop" },
    usage: USAGE,
    warnings: [],
  };
}

/** Asserts that two long texts are the same, saying where they differ rather than printing them whole. */
function same(actual: string, expected: string): void {
  if (actual === expected) return;
  let i = 0;
  while (i < actual.length && actual[i] === expected[i]) i++;
  assert.fail(
    `${actual.length} characters, ${expected.length} expected; from ${i}: ` +
      `${JSON.stringify(actual.slice(i, i + 120))} where ${JSON.stringify(expected.slice(i, i + 120))} was expected`,
  );
}

/** The tool results the model was sent in this call's prompt, by tool call id: `text` or `error-text`. */
function received(call: CallOptions | undefined): Map<string, { type: string; value: unknown }> {
  const found = new Map<string, { type: string; value: unknown }>();
  for (const message of call?.prompt ?? []) {
    if (message.role !== "tool") continue;
    for (const part of message.content) {
      if (part.type === "tool-result") found.set(part.toolCallId, { type: part.output.type, value: "value" in part.output ? part.output.value : undefined });
    }
  }
  return found;
}

test("a generateText loop runs its tool calls in the sandbox and sends the model their text", async () => {
  await runtime();
  await using sb = await Sandbox.create();
  const final = "42 is in answer.txt; doubled, 84; the plan is written.";
  const printing = "printf HEAD; head -c 50000 /dev/zero | tr '\\0' x; printf TAIL";
  const model = new MockLanguageModelV3({
    doGenerate: [
      turn(["c1", "run_shell", { command: "echo $((6*7)) > answer.txt; cat answer.txt" }]),
      turn(["c2", "run_python", { code: "n = int(open('answer.txt').read())\nn * 2" }]),
      turn(["c3", "write_file", { path: "notes/plan.md", content: "# Plan\nstep one\n" }]),
      turn(["c4", "read_file", { path: "notes/plan.md" }], ["c5", "list_files", { path: "notes" }]),
      turn(["c6", "read_file", { path: "notes/missing.md" }]),
      turn(["c7", "run_shell", { command: "ls notes/missing.md" }]),
      turn(["c8", "run_shell", { command: printing }]),
      answer(final),
    ],
  });

  const result = await generateText({
    model,
    tools: sandboxTools(sb, { limit: 1000 }),
    stopWhen: stepCountIs(10),
    prompt: "What is 6 times 7, doubled? Keep a plan.",
  });

  // The model was offered the five tools, with their arguments' schemas.
  const offered = model.doGenerateCalls[0]?.tools ?? [];
  assert.deepEqual(offered.map((t) => t.name), NAMES);
  const shell = offered[0];
  assert.ok(shell?.type === "function");
  const schema = shell.inputSchema as { required?: string[]; properties?: Record<string, { description?: string }> };
  assert.deepEqual(schema.required, ["command"]);
  assert.deepEqual(Object.keys(schema.properties ?? {}).sort(), ["command", "timeout"]);
  assert.equal(schema.properties?.command?.description, "The bash command line to run.");
  const listing = offered[4]?.type === "function" ? (offered[4].inputSchema as { required?: string[] }) : undefined;
  assert.deepEqual(listing?.required ?? [], []);
  assert.match(shell.description ?? "", /^Run a bash command in the sandbox/);

  // One model call per step, each sent the results of the calls before it.
  assert.equal(model.doGenerateCalls.length, 8);
  assert.equal(result.steps.length, 8);
  assert.equal(result.text, final);
  const results = received(model.doGenerateCalls[7]);
  assert.deepEqual([...results.keys()], ["c1", "c2", "c3", "c4", "c5", "c6", "c7", "c8"]);
  assert.deepEqual(results.get("c1"), { type: "text", value: "exit code: 0\n--- stdout ---\n42" });
  // The kernel sees the file the shell wrote: one sandbox, one workspace.
  assert.deepEqual(results.get("c2"), { type: "text", value: "status: ok\n--- result ---\n84" });
  assert.deepEqual(results.get("c3"), { type: "text", value: "wrote 16 bytes to notes/plan.md" });
  assert.deepEqual(results.get("c4"), { type: "text", value: "# Plan\nstep one\n" });
  assert.deepEqual(results.get("c5"), { type: "text", value: "notes/plan.md (16 bytes)" });
  // A refused call is the AI SDK's tool error, which the model reads; the loop goes on.
  assert.deepEqual(results.get("c6"), {
    type: "error-text",
    value: 'error: PATH_NOT_FOUND: "notes/missing.md" does not exist',
  });
  const refused = result.steps[4]?.content.find((p) => p.type === "tool-error");
  assert.ok(refused?.type === "tool-error" && refused.error instanceof SandboxToolError);
  assert.equal((refused.error as SandboxToolError).cause.reason, "PATH_NOT_FOUND");
  // A failing command is an answer with its exit code, not an error.
  const failed = results.get("c7");
  assert.equal(failed?.type, "text");
  assert.match(String(failed?.value), /^exit code: 2\n--- stderr ---\nls: cannot access 'notes\/missing.md/);
  // Long output: head and tail kept, the cut said.
  const whole = "exit code: 0\n--- stdout ---\nHEAD" + "x".repeat(50000) + "TAIL";
  const note =
    `\n[... ${(whole.length - 1000).toLocaleString("en-US")} characters cut from the middle: the output had ` +
    `${whole.length.toLocaleString("en-US")} characters, 1,000 are shown ...]\n`;
  assert.equal(results.get("c8")?.type, "text");
  same(String(results.get("c8")?.value), whole.slice(0, 500) + note + whole.slice(-500));

  // And the sandbox holds what the agent did.
  assert.equal(await sb.files.readText("notes/plan.md"), "# Plan\nstep one\n");
  assert.equal((await sb.run("cat answer.txt")).stdout, "42\n");
});

test("a streamText loop runs the tools too", async () => {
  await runtime();
  await using sb = await Sandbox.create();
  const model = new MockLanguageModelV3({
    doStream: [
      {
        stream: convertArrayToReadableStream([
          { type: "stream-start", warnings: [] },
          { type: "tool-call", toolCallId: "s1", toolName: "run_python", input: JSON.stringify({ code: "print('streamed')" }) },
          { type: "finish", finishReason: { unified: "tool-calls", raw: "tool_calls" }, usage: USAGE },
        ]),
      },
      {
        stream: convertArrayToReadableStream([
          { type: "stream-start", warnings: [] },
          { type: "text-start", id: "t" },
          { type: "text-delta", id: "t", delta: "done" },
          { type: "text-end", id: "t" },
          { type: "finish", finishReason: { unified: "stop", raw: "stop" }, usage: USAGE },
        ]),
      },
    ],
  });
  const result = streamText({ model, tools: sandboxTools(sb), stopWhen: stepCountIs(3), prompt: "go" });
  assert.equal(await result.text, "done");
  assert.deepEqual(received(model.doStreamCalls[1]).get("s1"), { type: "text", value: "status: ok\n--- output ---\nstreamed" });
});

test("the AI SDK's abortSignal cancels the running command in the sandbox", async () => {
  await runtime();
  await using sb = await Sandbox.create();
  const controller = new AbortController();
  const model = new MockLanguageModelV3({
    doGenerate: async (options) => {
      // As a provider's fetch does: an aborted call does not go out.
      options.abortSignal?.throwIfAborted();
      return turn(["a1", "run_shell", { command: "sleep 60; touch finished" }]);
    },
  });
  const started = Date.now();
  setTimeout(() => controller.abort(new Error("the user stopped it")), 1500);
  await assert.rejects(
    generateText({ model, tools: sandboxTools(sb), stopWhen: stepCountIs(3), prompt: "go", abortSignal: controller.signal }),
    /the user stopped it/,
  );
  assert.ok(Date.now() - started < 30_000, "generateText waited for the command");
  // The command was cancelled in the sandbox, not left to run.
  let left = "";
  for (let i = 0; i < 50; i++) {
    // (The pattern does not match this command's own shell.)
    left = (await sb.run("pgrep -f 'slee[p] 60' || true")).stdout;
    if (!left) break;
    await new Promise((r) => setTimeout(r, 100));
  }
  assert.equal(left, "", "the sleep still runs");
});

test("what the model reads", async () => {
  await runtime();
  await using sb = await Sandbox.create();
  const tools = sandboxTools(sb, { limit: 1000 });
  const options = { toolCallId: "t", messages: [] };
  const call = async <A>(t: { execute?: (args: A, o: typeof options) => unknown }, args: A): Promise<string> => {
    assert.ok(t.execute);
    return (await t.execute(args, options)) as string;
  };

  // Exit code, stdout and stderr; a timed-out command says so.
  assert.equal(
    await call(tools.run_shell, { command: "echo out; echo err >&2; exit 3" }),
    "exit code: 3\n--- stdout ---\nout\n--- stderr ---\nerr",
  );
  assert.equal(await call(tools.run_shell, { command: "true" }), "exit code: 0\n(no output)");
  const slow = await call(tools.run_shell, { command: "echo started; sleep 30", timeout: 1 });
  assert.ok(slow.startsWith("exit code: -1 (timed_out: "), slow);
  assert.ok(slow.endsWith("\n--- stdout ---\nstarted"), slow);

  // Without a limit, nothing is cut.
  const printing = { command: "printf HEAD; head -c 50000 /dev/zero | tr '\\0' x; printf TAIL" };
  const whole = "exit code: 0\n--- stdout ---\nHEAD" + "x".repeat(50000) + "TAIL";
  same(await call(sandboxTools(sb, { limit: 0 }).run_shell, printing), whole);
  // The default limit is 20,000: head and tail of 10,000 each.
  const capped = await call(sandboxTools(sb).run_shell, printing);
  assert.equal(DEFAULT_LIMIT, 20_000);
  same(
    capped,
    whole.slice(0, 10_000) +
      "\n[... 30,036 characters cut from the middle: the output had 50,036 characters, 20,000 are shown ...]\n" +
      whole.slice(-10_000),
  );

  // A cell: printed text, results (an image named by its type and size), the error and its traceback without
  // terminal colours.
  const cell = await call(tools.run_python, {
    code: "import matplotlib.pyplot as plt\nprint('plotting')\nplt.plot([1, 2]); plt.show()\n6 * 7",
  });
  assert.match(
    cell,
    /^status: ok\n--- output ---\nplotting\n--- result ---\n<Figure size \d+x\d+ with 1 Axes>\n\[image\/png, [\d,]+ bytes: not shown\]\n42$/,
  );
  const failed = await call(tools.run_python, { code: "def f():\n    return 1 / 0\nf()" });
  assert.ok(failed.startsWith("status: error\n--- error ---\nZeroDivisionError: division by zero\n"), failed);
  assert.ok(failed.includes("----> 3 f()") && !failed.includes("\x1b["), failed);
  assert.ok(failed.endsWith("ZeroDivisionError: division by zero"), failed);

  // Files: text as is, a long one cut, a binary one named, an empty one said.
  await sb.files.write("big.txt", "z".repeat(3000));
  const big = await call(tools.read_file, { path: "big.txt" });
  assert.equal(big, "z".repeat(500) + "\n[... 2,000 characters cut from the middle: the output had 3,000 characters, 1,000 are shown ...]\n" + "z".repeat(500));
  await sb.files.write("blob.bin", Uint8Array.from({ length: 256 }, (_, i) => i));
  assert.equal(
    await call(tools.read_file, { path: "blob.bin" }),
    "blob.bin is not UTF-8 text (256 bytes): inspect it with run_python or run_shell.",
  );
  await sb.files.write("empty.txt", "");
  assert.equal(await call(tools.read_file, { path: "empty.txt" }), "empty.txt is empty.");
  // Characters are counted as Python counts them (code points): 1,500 emoji and their bytes.
  await sb.files.write("faces.txt", "😀".repeat(1500));
  assert.equal(
    await call(tools.read_file, { path: "faces.txt" }),
    "😀".repeat(500) + "\n[... 500 characters cut from the middle: the output had 1,500 characters, 1,000 are shown ...]\n" + "😀".repeat(500),
  );
  assert.equal(await call(tools.write_file, { path: "w/é😀.txt", content: "hé😀" }), "wrote 7 bytes to w/é😀.txt");

  // Listings: sorted by code point as Python sorts (～ U+FF5E before 😀 U+1F600), links with their target,
  // sizes with commas.
  await sb.run("mkdir -p tree/sub && echo hi > tree/sub/f && ln -s sub/f tree/link && head -c 1234567 /dev/zero > tree/～ && touch tree/😀 tree/Z");
  assert.equal(
    await call(tools.list_files, { path: "tree" }),
    "tree/Z (0 bytes)\ntree/link -> sub/f\ntree/sub/\ntree/～ (1,234,567 bytes)\ntree/😀 (0 bytes)",
  );
  await sb.run("mkdir -p hollow");
  assert.equal(await call(tools.list_files, { path: "hollow" }), "hollow is empty.");
  // No path: the workspace folder.
  assert.equal(
    await call(tools.list_files, {}),
    "big.txt (3,000 bytes)\nblob.bin (256 bytes)\nempty.txt (0 bytes)\nfaces.txt (6,000 bytes)\nhollow/\ntree/\nw/",
  );
});

test("a sandbox gone is the tool's error, with the runtime's reason", async () => {
  await runtime();
  await using sb = await Sandbox.create();
  const tools = sandboxTools(sb);
  await sb.delete();
  assert.ok(tools.run_shell.execute);
  await assert.rejects(
    Promise.resolve(tools.run_shell.execute({ command: "echo hi" }, { toolCallId: "g1", messages: [] })),
    (e: unknown) =>
      e instanceof SandboxToolError &&
      e.message === `error: SANDBOX_ENDED: sandbox ${sb.id} is TERMINATED; an action needs it RUNNING` &&
      e.cause.code === "FAILED_PRECONDITION",
  );
});

test("only sandboxes make tools, and the limit is a whole number", async () => {
  assert.throws(() => sandboxTools("sandbox-id" as unknown as Sandbox), /takes a mentis-sandbox Sandbox, not string/);
  await runtime();
  await using sb = await Sandbox.create();
  assert.throws(() => sandboxTools(sb, { limit: 1.5 }), RangeError);
});
