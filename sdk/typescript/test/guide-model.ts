/**
 * Loaded (`node --import`) before docs/SDK-TS.md's Vercel AI SDK block, which names a `model` it declares but
 * does not make: a scripted MockLanguageModelV3 as `globalThis.model`, which asks for one run_python call and
 * then answers; at exit it prints the tool result it was sent, for guide.test.ts to check.
 */
import { MockLanguageModelV3 } from "ai/test";

type GenerateResult = Awaited<ReturnType<MockLanguageModelV3["doGenerate"]>>;
const usage: GenerateResult["usage"] = {
  inputTokens: { total: 1, noCache: 1, cacheRead: undefined, cacheWrite: undefined },
  outputTokens: { total: 1, text: 1, reasoning: undefined },
};
let seen = "";
let turns = 0;
const model = new MockLanguageModelV3({
  doGenerate: async (options) => {
    turns++;
    if (turns === 1) {
      return {
        content: [{ type: "tool-call", toolCallId: "1", toolName: "run_python", input: JSON.stringify({ code: "6 * 7" }) }],
        finishReason: { unified: "tool-calls", raw: "tool_calls" },
        usage,
        warnings: [],
      };
    }
    for (const message of options.prompt) {
      if (message.role !== "tool") continue;
      for (const part of message.content) {
        if (part.type === "tool-result") seen = JSON.stringify(part.output);
      }
    }
    return { content: [{ type: "text", text: "42" }], finishReason: { unified: "stop", raw: "stop" }, usage, warnings: [] };
  },
});
(globalThis as { model?: unknown }).model = model;
process.on("exit", () => console.log(`the model was sent: ${seen}`));
