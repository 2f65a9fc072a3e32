/**
 * The sandbox's tools for LangChain.js and LangGraph.js (`npm install @langchain/core zod`).
 *
 *     import { createAgent } from "langchain";
 *     import { Sandbox } from "mentis-sandbox";
 *     import { sandboxTools } from "mentis-sandbox/langchain";
 *
 *     await using sb = await Sandbox.create();
 *     const agent = createAgent({ model, tools: sandboxTools(sb) });   // or model.bindTools(tools), ToolNode
 *     await agent.invoke({ messages: [{ role: "user", content: "What is 6 times 7? Compute it in Python." }] });
 *
 * Each tool returns text for the model: a command's exit code, stdout and stderr; a cell's printed text,
 * results and error; a file's content. Long text is cut in the middle to `limit` characters, with a note
 * saying so. A command that fails is an answer with its exit code. A call the runtime refuses (a missing
 * file, a sandbox gone) is the tool's answer too: invoked with a tool call, a ToolMessage with status
 * "error" whose content the model reads (the loop goes on); invoked with plain arguments, that text. The
 * run's `signal` cancels a running command or interrupts a running cell.
 */
import { ToolMessage } from "@langchain/core/messages";
import { type DynamicStructuredTool, tool, type ToolRunnableConfig } from "@langchain/core/tools";
import type { z } from "zod";
import type { Sandbox } from "../sandbox.js";
import {
  type CallOptions,
  checkArguments,
  errorText,
  guarded,
  LIST_FILES,
  listFiles,
  READ_FILE,
  readFile,
  RUN_PYTHON,
  RUN_SHELL,
  runPython,
  runShell,
  type SandboxToolsOptions,
  type ToolSpec,
  WRITE_FILE,
  writeFile,
} from "./common.js";
import { listFilesSchema, readFileSchema, runPythonSchema, runShellSchema, writeFileSchema } from "./schemas.js";

export { clip, DEFAULT_LIMIT, type SandboxToolsOptions } from "./common.js";

/** One of the sandbox's tools as LangChain takes it. */
export type SandboxTool = DynamicStructuredTool;

/**
 * The tools `run_shell`, `run_python`, `read_file`, `write_file` and `list_files` on `sandbox`, as LangChain
 * tools, in that order (for `model.bindTools`, `createAgent`, LangGraph's `ToolNode`). `limit` is the most
 * characters of one answer given to the model (the middle of a longer one is cut, with a note; 0: no limit;
 * default 20,000).
 */
export function sandboxTools(sandbox: Sandbox, options: SandboxToolsOptions = {}): SandboxTool[] {
  const { sandbox: target, limit } = checkArguments(sandbox, options);

  function make<S extends z.ZodObject>(
    spec: ToolSpec,
    schema: S,
    call: (sb: Sandbox, args: z.output<S>, options: CallOptions) => Promise<string>,
  ): SandboxTool {
    const run = (args: z.output<S>, config: ToolRunnableConfig | undefined): Promise<string | ToolMessage> =>
      guarded<string | ToolMessage>(
        () => call(target, args, { limit, signal: config?.signal }),
        (e) => {
          const content = errorText(e);
          const id = config?.toolCall?.id;
          // With a tool call, the error's ToolMessage (LangChain passes a ToolMessage through as the answer);
          // with plain arguments, its text, as Python's handle_tool_error gives it.
          return id ? new ToolMessage({ content, tool_call_id: id, name: spec.name, status: "error" }) : content;
        },
      );
    return tool(run, { name: spec.name, description: spec.description, schema });
  }

  return [
    make(RUN_SHELL, runShellSchema, runShell),
    make(RUN_PYTHON, runPythonSchema, runPython),
    make(READ_FILE, readFileSchema, readFile),
    make(WRITE_FILE, writeFileSchema, writeFile),
    make(LIST_FILES, listFilesSchema, listFiles),
  ];
}
