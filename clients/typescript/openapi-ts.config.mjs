// `scripts/generate_clients.sh` runs this from clients/typescript; tsconfig.json here makes the
// generator write `.js` import suffixes, which Node's ESM loader needs in the compiled output.
export default {
  input: '../../openapi.json',
  output: 'src',
  plugins: [
    // Export the shared `client` from the entry point so callers can set its baseUrl.
    { name: '@hey-api/client-fetch', includeInEntry: true },
    '@hey-api/typescript',
    '@hey-api/sdk',
  ],
};
