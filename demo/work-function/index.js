// The demo's unit of work, run from its synthesized asset by the simulator: it takes `workSeconds`
// (simulated; the simulator tells it how fast its clock runs) and fails when the input says so, like
// the AWS sample's work function, which sleeps 15 s and fails 10% of the time.
const timeScale = Number(process.env.SIM_TIME_SCALE || '1');

exports.handler = async (event) => {
  const seconds = event.workSeconds ?? 15;
  await new Promise((resolve) => setTimeout(resolve, seconds * 1000 * timeScale));
  if (event.fail) {
    const error = new Error(`work ${event.id} failed`);
    error.name = 'WorkFailed';
    throw error;
  }
  return { id: event.id, workedSeconds: seconds };
};
