/**
 * The tools' arguments as zod schemas, the schema both the AI SDK and LangChain give the model (the same
 * arguments and descriptions as the Python SDK's: sdk/python/src/mentis/integrations/_schemas.py).
 *
 * Optional arguments are `.optional()` (with no default) so that every framework's JSON schema leaves them out
 * of `required`, whether it converts the schema's input or its output.
 */
import { z } from "zod";
import { ARGUMENTS } from "./common.js";

/** `run_shell(command, timeout?)`. */
export const runShellSchema = z.object({
  command: z.string().describe(ARGUMENTS.command),
  timeout: z.number().nullish().describe(ARGUMENTS.timeout),
});

/** `run_python(code)`. */
export const runPythonSchema = z.object({
  code: z.string().describe(ARGUMENTS.code),
});

/** `read_file(path)`. */
export const readFileSchema = z.object({
  path: z.string().describe(ARGUMENTS.path),
});

/** `write_file(path, content)`. */
export const writeFileSchema = z.object({
  path: z.string().describe(ARGUMENTS.path),
  content: z.string().describe(ARGUMENTS.content),
});

/** `list_files(path?)`. */
export const listFilesSchema = z.object({
  path: z.string().optional().describe(ARGUMENTS.folder),
});
